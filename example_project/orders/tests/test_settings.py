"""Where the shop's locks and broker live: REDIS_URL, else one embedded server for both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[2]
SHOW = """
import json, redis
from shop import settings
from django_rlock.core._sync.connection import connect
url = settings.CELERY_BROKER_URL
lock = settings.RLOCKS["default"]
info = {"backend": lock["BACKEND"], "location": lock["LOCATION"], "broker": url}
if url.startswith("redis+socket://"):
    info["ping"] = redis.Redis(unix_socket_path=url[len("redis+socket://"):]).ping()
print(json.dumps(info))
"""


def settings_with(tmp_path: Path, **env: str) -> dict[str, object]:
    base = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    done = subprocess.run(
        [sys.executable, "-c", SHOW],
        cwd=PROJECT_DIR,
        env={**base, "SHOP_DATA_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    info: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return info


def test_redis_url_serves_the_locks_and_the_broker(tmp_path: Path) -> None:
    info = settings_with(tmp_path, REDIS_URL="redis://127.0.0.1:6379/5")

    assert info == {
        "backend": "django_rlock.backends.redis.RedisLockBackend",
        "location": "redis://127.0.0.1:6379/5",
        "broker": "redis://127.0.0.1:6379/5",
    }


def test_without_redis_url_one_embedded_server_serves_both_over_a_unix_socket(
    tmp_path: Path,
) -> None:
    info = settings_with(tmp_path)

    assert info["backend"] == "django_rlock.backends.embedded.EmbeddedRedisLockBackend"
    assert info["location"] == str(tmp_path / "redis.rdb")
    assert str(info["broker"]).startswith("redis+socket:///")
    assert info["ping"] is True
    # The server stops after its last user, the process above (a few tenths of a second).
    socket = Path(str(info["broker"])[len("redis+socket://") :])
    deadline = time.monotonic() + 30
    while socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not socket.exists()
