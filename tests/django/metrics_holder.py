"""One process taking a lock with (or without) metrics, steered line by line by a test.

Run as ``python -m tests.django.metrics_holder REDIS_URL ORDER_ID METRICS``
(``METRICS``: ``prometheus`` or ``off``), with ``PROMETHEUS_MULTIPROC_DIR`` in
its environment for the multiprocess tests. It sets Django up, holds
``@locked("order:{order_id}")`` for ``ORDER_ID`` and says
``held <whether prometheus_client is imported>``, waits for ``release`` on
stdin, then says ``released`` and exits.
"""

from __future__ import annotations

import sys

import django
from django.conf import settings


def main(url: str, order_id: str, metrics: str) -> None:
    settings.configure(
        RLOCKS={"default": {"LOCATION": url, "KEY_PREFIX": "t"}},
        RLOCK_METRICS=None if metrics == "off" else metrics,
    )
    django.setup()
    from django_rlock import locked  # noqa: PLC0415 -- needs the settings above

    @locked("order:{order_id}")
    def hold(order_id: str) -> None:
        print(f"held {'prometheus_client' in sys.modules}", flush=True)
        line = sys.stdin.readline().strip()
        if line != "release":
            raise SystemExit(f"expected 'release' on stdin, got {line!r}")

    hold(order_id)
    print("released", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
