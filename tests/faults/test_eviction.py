"""Fault 5: Redis short of memory.

An evicting policy can drop a held lock's key: the Django deploy check warns
about it. With ``noeviction`` and memory full, Redis refuses writes that may
grow memory: a new acquire must fail with a clear OOM error and change
nothing, while renewals and releases of locks already held go on working
(their scripts carry ``allow-oom`` on Redis >= 7), so a full server stops new
grants without stranding the holders.
"""

from __future__ import annotations

import threading

import pytest
import redis
from django.test import override_settings

from django_rlock._checks import check_eviction_policy
from django_rlock.core import LockClient, LockOutOfMemoryError
from django_rlock.core._sync.watchdog import get_watchdog
from tests.faults import eviction_scenario
from tests.faults.conftest import TIMEOUT, ServerFactory, server_major
from tests.faults.recorder import LockWatch

pytestmark = pytest.mark.faults


def test_deploy_check_warns_on_volatile_lru(start_server: ServerFactory) -> None:
    server = start_server("--maxmemory", "2mb", "--maxmemory-policy", "volatile-lru")
    rlocks = {"default": {"LOCATION": server.url}}
    with override_settings(RLOCKS=rlocks):
        warnings = check_eviction_policy()
    assert [warning.id for warning in warnings] == ["django_rlock.W003"]
    assert "volatile-lru" in warnings[0].msg


def _fill(admin: redis.Redis) -> None:
    """Write until Redis says OOM, then keep it full (usage hovers around the limit)."""
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 256 * 1024)
    value = b"x" * 16 * 1024
    for index in range(1000):
        try:
            admin.set(f"ballast:{index}", value)
        except redis.exceptions.OutOfMemoryError:
            # Full. Lower the limit well below usage, so that freeing a few
            # bytes (a release) cannot make room again during the test.
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) // 2)
            return
    raise AssertionError("Redis never ran out of memory")


def test_full_memory_refuses_acquire_but_renews_and_releases(
    start_server: ServerFactory,
) -> None:
    if server_major() < 7:
        pytest.skip("releasing under OOM needs allow-oom scripts (Redis >= 7)")
    server = start_server("--maxmemory-policy", "noeviction")
    admin = server.client()
    with LockClient(server.url, key_prefix="f", watchdog_timeout=TIMEOUT) as client:
        held = client.lock("held")
        assert held.acquire() and held.acquire()  # two holds: a partial release too
        watch = LockWatch(held)
        _fill(admin)

        fresh = client.lock("fresh")
        with pytest.raises(LockOutOfMemoryError, match="out of memory \\(OOM") as refused:
            fresh.acquire(blocking=False)
        assert "command not allowed when used memory > 'maxmemory'" in str(refused.value)
        assert not admin.exists(fresh.keys.hash, fresh.keys.fence)

        # A waiter is refused too (registering as a waiter is a write), from another thread.
        outcome: list[BaseException] = []
        waiter = threading.Thread(
            target=lambda: _capture(outcome, lambda: client.lock("held").acquire(timeout=1))
        )
        waiter.start()
        waiter.join(5)
        assert [type(error) for error in outcome] == [LockOutOfMemoryError]

        failures = get_watchdog().renewal_failures
        for _ in range(3):
            watch.wait_for_renewal()
        assert get_watchdog().renewal_failures == failures and not held.lost
        assert admin.pttl(held.keys.hash) > (TIMEOUT - TIMEOUT / 3) * 1000 - 100

        held.release()
        assert held.hold_count() == 1
        held.release()
        assert not held.locked()
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("still", "full")
    admin.close()


def _capture(into: list[BaseException], call: object) -> None:
    try:
        call()  # type: ignore[operator]
    except BaseException as error:  # noqa: BLE001 -- the test inspects it
        into.append(error)


@pytest.mark.slow
def test_volatile_lru_evicts_held_locks_and_a_rival_takes_them_first(
    start_server: ServerFactory,
) -> None:
    # What docs/guarantees.md ("Eviction") measures with tests/faults/eviction_scenario.py.
    outcome = eviction_scenario.run(start_server())
    assert outcome.evicted > 0  # lock keys carry a TTL: volatile-lru evicts them
    assert outcome.told == outcome.evicted  # every holder is told, at a renewal...
    assert outcome.taken_first > 0  # ...after a rival held its lock
