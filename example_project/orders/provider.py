"""A stand-in for a payment provider's API: it answers after a network round trip."""

import time

from django.conf import settings


def charge(order_id: int, amount: int) -> None:
    """Charge ``amount`` cents for order ``order_id``."""
    time.sleep(settings.SHOP_PAYMENT_LATENCY)


def refund(order_id: int, amount: int) -> None:
    """Refund ``amount`` cents for order ``order_id``."""
    time.sleep(settings.SHOP_PAYMENT_LATENCY)
