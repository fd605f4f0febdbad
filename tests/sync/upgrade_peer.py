"""A lock user driven over stdin/stdout, run by another installed version of the package.

Usage: ``PYTHON upgrade_peer.py URL``, where PYTHON may be another virtualenv's
interpreter (tests/sync/test_rolling_upgrade.py runs the previous release so):
it imports only the public API of ``django_rlock.core`` and nothing of the
tests. Each line on stdin is a command, each answer one JSON line; times are
``time.monotonic()``, the machine's clock on Linux and macOS, so the test can
compare them with its own:

* ``hold NAME``: take the lock (key prefix ``test``), answer ``{"held": true}``;
* ``try NAME``: one attempt, released at once if granted: ``{"got": ...}``;
* ``wait NAME``: answer ``{"waiting": true}``, then wait for the lock (up to
  60 s) and answer ``{"granted": ..., "at": ...}``; it then holds it;
* ``release``: release the lock it holds, ``{"released_at": ...}``;
* ``count NAME N``: N times, take the lock and add one to the key
  ``test:count:NAME`` by a GET and a SET (an update the lock must protect),
  then answer ``{"counted": N}``;
* ``holder NAME``: who holds the lock as this version's operator views read it
  (``read_holder`` on the hash's fields, as ``manage.py rlock inspect`` does;
  not public API, but every version has it): ``{"holder": ...}``.

It ends at the end of its input.
"""

from __future__ import annotations

import json
import sys
import time

from django_rlock.core import LockClient, RLock


def answer(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def count(lock: RLock, client: LockClient, key: str, times: int) -> int:
    for _ in range(times):
        with lock:
            value = int(client.redis.get(key) or 0)
            client.redis.set(key, value + 1)
    return times


def main() -> None:
    with LockClient(sys.argv[1], key_prefix="test") as client:
        held: RLock | None = None
        for line in sys.stdin:
            command, name, times = [*line.split(), "", ""][:3]
            if command == "hold":
                held = client.lock(name)
                answer(held=held.acquire())
            elif command == "try":
                lock = client.lock(name)
                got = lock.acquire(blocking=False)
                if got:
                    lock.release()
                answer(got=got)
            elif command == "wait":
                held = client.lock(name)
                answer(waiting=True)
                granted = held.acquire(timeout=60)
                answer(granted=granted, at=time.monotonic())
            elif command == "count":
                lock = client.lock(name, timeout=60)  # a hang ends as LockTimeout, and the peer
                answer(counted=count(lock, client, f"test:count:{name}", int(times)))
            elif command == "holder":
                from django_rlock.core._process.holder import read_holder  # noqa: PLC0415

                raw = client.redis.hgetall(f"test:{{{name}}}")
                fields = {_text(key): _text(value) for key, value in raw.items()}
                answer(holder=read_holder(fields))
            elif command == "release" and held is not None:
                released_at = time.monotonic()
                held.release()
                held = None
                answer(released_at=released_at)


if __name__ == "__main__":
    main()
