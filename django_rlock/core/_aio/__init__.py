"""The asyncio engine: the same shells, awaited."""
