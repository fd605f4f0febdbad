"""Fixtures for multi-server topologies: built once per session or module, torn down after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis.cluster import RedisCluster

from django_rlock.core import LockClient, RLock
from django_rlock.core._protocol.holds import Hold
from django_rlock.core._sync.watchdog import on_renewal, remove_on_renewal
from tests.servers import RedisServer
from tests.topologies.builders import Cluster, SentinelGroup, Standalones, Unavailable, wait_until


@pytest.fixture(scope="session")
def five_servers() -> Iterator[Standalones]:
    with Standalones(5) as servers:
        yield servers


@pytest.fixture
def servers(five_servers: Standalones) -> list[RedisServer]:
    """Five independent, running, empty servers (a test may stop some)."""
    five_servers.restart_stopped()
    five_servers.flush()
    return five_servers.servers


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A 3-master Redis Cluster, one per test module."""
    topology = Cluster(3)
    with running(topology):
        yield topology


@pytest.fixture
def raw(cluster: Cluster) -> Iterator[RedisCluster]:
    """A client of ``cluster``, on emptied masters."""
    client = cluster.client()
    client.flushall()
    yield client
    client.close()


@contextmanager
def running(topology: Cluster | SentinelGroup) -> Iterator[None]:
    """Start ``topology`` for the block, or skip naming the binary that is not installed."""
    try:
        topology.__enter__()
    except Unavailable as missing:
        pytest.skip(str(missing))
    try:
        yield
    finally:
        topology.__exit__()


class Renewals:
    """Every renewal outcome the watchdog reports, in order, while in use."""

    def __init__(self) -> None:
        self.outcomes: list[tuple[Hold, str]] = []

    def __enter__(self) -> Renewals:
        on_renewal(self._record)
        return self

    def __exit__(self, *exc_info: object) -> None:
        remove_on_renewal(self._record)

    def _record(self, hold: Hold, outcome: str) -> None:
        self.outcomes.append((hold, outcome))

    def next_round(self, holds: int) -> list[tuple[Hold, str]]:
        """The outcomes of the next round, waited for: one per hold when nothing moves."""
        start = len(self.outcomes)
        wait_until(lambda: len(self.outcomes) >= start + holds, 60, "a renewal round")
        return self.outcomes[start : start + holds]


def held_locks(client: LockClient, prefix: str, count: int) -> list[RLock]:
    """``count`` locks of ``client`` named ``<prefix>:<index>``, each acquired (watchdog)."""
    locks = [client.lock(f"{prefix}:{index}") for index in range(count)]
    for lock in locks:
        lock.acquire()
    return locks
