"""Every whole Lua script the engines send, by kind and name (``"fairlock.acquire"``).

Read from the kinds' own :class:`~django_rlock.core._protocol.lock.ScriptSet`
classes, by registering each with a maker that keeps the body instead of
loading it: what is listed here is exactly what a client sends. The rendered
scripts are committed under ``docs/lua/`` (``python -m
django_rlock.core._protocol.catalog docs/lua`` writes them; a test fails when
one is stale).
"""

from __future__ import annotations

import pathlib
import sys

from django_rlock.core._protocol.deadlocks import DeadlockScripts
from django_rlock.core._protocol.fairlock import FairScripts
from django_rlock.core._protocol.lock import LockScripts, ScriptSet
from django_rlock.core._protocol.ratelimit import RateLimiterScripts
from django_rlock.core._protocol.redisson import RedissonScripts
from django_rlock.core._protocol.rwlock import RWScripts
from django_rlock.core._protocol.semaphore import SemaphoreScripts

#: Each kind's script set, by the name its files carry.
KINDS: dict[str, type[ScriptSet]] = {
    "lock": LockScripts,
    "fairlock": FairScripts,
    "rwlock": RWScripts,
    "semaphore": SemaphoreScripts,
    # layout="redisson": the plain lock on Redisson's keys (RENEW is the lock's own)
    "redisson-lock": RedissonScripts,
    "ratelimit": RateLimiterScripts,
    # the deadlock detector's read of a lock's holder and grant
    "deadlock": DeadlockScripts,
}


def _kept(body: str) -> str:
    return body


def scripts() -> dict[str, str]:
    """Every script body, by ``"<kind>.<name>"``, as the clients register it."""
    found = {}
    for kind, script_set in KINDS.items():
        made = script_set(_kept, _kept)
        for name, body in vars(made).items():
            found[f"{kind}.{name}"] = body
    return found


def render(name: str, body: str) -> str:
    """The text of ``docs/lua/<name>.lua``: a header line, then the script as sent."""
    return f"-- {name}: generated from django_rlock/core/_protocol (do not edit)\n{body.strip()}\n"


def write(directory: pathlib.Path) -> list[pathlib.Path]:
    """Write every script to ``directory``; remove the ones no kind sends any more."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, body in scripts().items():
        path = directory / f"{name}.lua"
        path.write_text(render(name, body))
        written.append(path)
    for stale in set(directory.glob("*.lua")) - set(written):
        stale.unlink()
    return written


if __name__ == "__main__":
    for path in write(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "docs/lua")):
        print(path)
