"""One process using the embedded backend, steered line by line by a test.

Run as ``python -m tests.django.embedded_user LOCATION INCREMENTS``. It sets
Django up (which starts no server), says ``ready`` and waits for ``go``: the
test sends ``go`` to every process at once, so all of them reach the backend
for the first time together. Each then adds 1 to a counter INCREMENTS times,
reading and writing it under the lock (a lost update shows up as a short
count), says ``done`` and waits for ``check``; then it prints the counter and
the ``run_id`` of the redis-server it talks to, and waits for ``exit``.
"""

from __future__ import annotations

import sys
import time

import django
from django.conf import settings


def say(line: str) -> None:
    print(line, flush=True)


def expect(word: str) -> None:
    line = sys.stdin.readline().strip()
    if line != word:
        raise SystemExit(f"expected {word!r} on stdin, got {line!r}")


def main(location: str, increments: int) -> None:
    settings.configure(
        RLOCKS={
            "default": {
                "BACKEND": "django_rlock.backends.embedded.EmbeddedRedisLockBackend",
                "LOCATION": location,
                "KEY_PREFIX": "t",
            }
        }
    )
    django.setup()
    from django_rlock import locks  # noqa: PLC0415 -- needs the settings above
    from django_rlock.backends.embedded import EmbeddedRedisLockBackend  # noqa: PLC0415

    say("ready")
    expect("go")
    backend = locks["default"]
    assert isinstance(backend, EmbeddedRedisLockBackend)
    for _ in range(increments):
        with backend.lock("counter"):
            redis = backend.client.redis
            value = int(redis.get("counter") or 0)
            # Lets another process's write land in between, were it not excluded.
            time.sleep(0.001)
            redis.set("counter", value + 1)
    say("done")
    expect("check")
    redis = backend.client.redis
    say(f"counted {int(redis.get('counter') or 0)} {redis.info('server')['run_id']}")
    expect("exit")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
