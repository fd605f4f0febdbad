"""Fixtures for multi-server topologies: built once per session or module, torn down after."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

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
