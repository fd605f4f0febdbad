"""Locks of the previous layout (token counter and latch keys beside the hash) during an upgrade.

Until every process runs this version, a lock may be granted by the previous
version's scripts, which keep the token in ``<lock>:fence`` and a request latch
per owner, where this version keeps both in the hash. The two must still
exclude each other, and tokens must keep increasing from one to the other.
The previous scripts are composed here from the shared Lua pieces, as the
previous version composed them (the fair lock still uses them).
"""

from __future__ import annotations

import redis
from redis.commands.core import Script

from django_rlock.core import LockClient
from django_rlock.core._protocol.lua import (
    CURRENT_TOKEN,
    drop_lost_grant,
    new_grant,
    register_waiter,
    release_one,
    report_or_reenter,
    wake_after_release,
)

PREVIOUS_ACQUIRE = (
    "\nlocal ttl = tonumber(ARGV[2])\n"
    + drop_lost_grant()
    + report_or_reenter(latch="4", token=CURRENT_TOKEN, fence="KEYS[2]")
    + "\nif redis.call('exists', KEYS[1]) == 0 then\n"
    + new_grant(latch="4")
    + "\nend\nlocal pttl = redis.call('pttl', KEYS[1])\n"
    + register_waiter()
)

PREVIOUS_RELEASE = release_one(latch="4") + wake_after_release(waiters="KEYS[3]", channel="KEYS[2]")

#: An owner of another process, running the previous version.
OLD_OWNER = "6f1c1f7e-0000-4000-8000-000000000001:1"


def test_both_versions_exclude_each_other_and_tokens_keep_increasing(
    lock_client: LockClient, r: redis.Redis
) -> None:
    lock = lock_client.lock("upgraded")
    keys = lock.keys
    old_keys = [keys.hash, keys.fence, keys.waiters, keys.latch(OLD_OWNER)]
    acquire, release = Script(r, PREVIOUS_ACQUIRE), Script(r, PREVIOUS_RELEASE)

    def old_acquire(rid: str) -> object:
        return acquire(keys=old_keys, args=[OLD_OWNER, 30_000, "", 0, rid, 0, "0", ""])

    def old_release(rid: str) -> object:
        return release(
            keys=[keys.hash, keys.channel, keys.waiters, keys.latch(OLD_OWNER)],
            args=[OLD_OWNER, "publish", rid],
        )

    granted = old_acquire("1")
    assert isinstance(granted, list)
    old_token = int(granted[0])
    assert lock.locked() and not lock.acquire(blocking=False)
    assert old_release("2") == 0

    with lock:
        assert lock.token is not None and lock.token > old_token
        new_token = lock.token
        busy = old_acquire("3")  # the previous scripts see a holder: its PTTL
        assert isinstance(busy, int) and busy > 0
    granted = old_acquire("4")
    assert isinstance(granted, list) and int(granted[0]) > new_token
    assert old_release("5") == 0
    assert not lock.locked()
