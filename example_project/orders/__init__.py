"""Orders, payments and refunds, each change made under the order's distributed lock."""
