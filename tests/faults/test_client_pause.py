"""Fault 4: the holder process is paused (SIGSTOP) past its lease.

Another owner gets the lock (the paused process cannot renew). When the first
wakes (SIGCONT) it must learn it lost the lock before it can release, and its
stale write must be refused by a fenced resource (tests/faults/fencing.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_rlock.core import LockClient
from tests.faults.conftest import TIMEOUT
from tests.faults.fencing import FencedResource
from tests.servers import RedisServer

pytestmark = pytest.mark.faults


def test_paused_holder_learns_it_lost_and_its_stale_write_is_refused(
    private_server: RedisServer, tmp_path: Path
) -> None:
    db = tmp_path / "resource.sqlite3"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.faults.paused_holder",
            private_server.url,
            "paused",
            str(TIMEOUT),
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    resource = FencedResource(db)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        first_token = json.loads(holder.stdout.readline())["token"]
        os.kill(holder.pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        with LockClient(private_server.url, key_prefix="f", watchdog_timeout=TIMEOUT) as client:
            lock = client.lock("paused")
            assert lock.acquire(timeout=3 * TIMEOUT)
            # Granted only once the paused holder's key expired.
            assert time.monotonic() - stopped_at >= TIMEOUT / 3
            assert lock.token is not None and lock.token > first_token
            assert resource.write("paused", "second holder", token=lock.token)
            os.kill(holder.pid, signal.SIGCONT)
            holder.stdin.write("go\n")
            holder.stdin.flush()
            report = json.loads(holder.stdout.readline())
            assert report == {"lost": True, "write_accepted": False, "release": "LockLostError"}
            assert resource.read("paused") == ("second holder", lock.token)
            assert lock.owned()
            lock.release()
        assert holder.wait(10) == 0
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait(10)
        resource.close()


def test_fenced_resource_accepts_equal_and_newer_tokens_only(tmp_path: Path) -> None:
    resource = FencedResource(tmp_path / "r.sqlite3")
    assert resource.write("k", "a", token=5)
    assert resource.write("k", "b", token=5)  # the same holder, again
    assert resource.write("k", "c", token=7)
    assert not resource.write("k", "stale", token=6)
    assert resource.read("k") == ("c", 7)
    assert resource.write("other", "x", token=1)  # tokens are per record
    with pytest.raises(ValueError, match="token"):
        resource.write("k", "d", token=None)
    resource.close()
