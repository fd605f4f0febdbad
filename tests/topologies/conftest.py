"""Fixtures for multi-server topologies: built once per session or module, torn down after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from redis.cluster import RedisCluster

from tests.servers import RedisServer
from tests.topologies.builders import Cluster, SentinelGroup, Standalones, Unavailable


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
