"""The lock contract, rerun on the siblings that promise it: fair locks and write locks.

A FairLock is an RLock, rule for rule, and so is a read-write lock's write side
(exclusive, reentrant, renewed, fenced). Every rule of the contract, waiting
and fault modules runs again here on the engines that have both (the sync and
asyncio clients), once with the driver's locks made by ``fair_lock`` and once
by ``read_write_lock(name).write`` instead of ``lock``. The rules are the very
functions of those modules (copied with new parameters), so a rule added there
is run on the siblings too, and a sibling that drifts from the contract fails.
(A read side shares by design, so it has rules of its own in tests/sync.)
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest

from django_rlock.core import FairLock, WriteLock
from django_rlock.core.aio import AsyncFairLock, AsyncWriteLock
from tests.conformance import test_contract, test_faults, test_waiting
from tests.conformance.drivers import Driver, Engine
from tests.conformance.test_faults import acl_user  # the fault rules' own fixture

__all__ = ["acl_user"]  # re-exported for the copied fault rules

Connect = Callable[..., Driver]

#: The engines with fair and read-write locks: the core's clients (Django's faces have none).
FAIR_ENGINES = ("sync", "asyncio")

Sibling = FairLock | AsyncFairLock | WriteLock | AsyncWriteLock

#: How each sibling is made from a client, with a lock's arguments.
SIBLINGS: dict[str, Callable[..., Sibling]] = {
    "fair": lambda client, name, **defaults: client.fair_lock(name, **defaults),
    "write": lambda client, name, **defaults: client.read_write_lock(name, **defaults).write,
}


@pytest.fixture(params=sorted(SIBLINGS))
def connect(connect: Connect, request: pytest.FixtureRequest) -> Connect:
    """The suite's ``connect``, whose drivers make the sibling of this run."""
    make = SIBLINGS[request.param]

    def connect_sibling(engine: Engine, **options: Any) -> Driver:
        driver = connect(engine, **options)
        # The driver's lock factory is its client's bound `lock`.
        client = driver.new_lock.__self__  # type: ignore[attr-defined]

        def new_lock(name: str, **defaults: Any) -> Sibling:
            made = make(client, name, **defaults)
            assert isinstance(made, FairLock | AsyncFairLock | WriteLock | AsyncWriteLock)
            return made

        driver.new_lock = new_lock
        return driver

    return connect_sibling


def _engine_params(rule: Callable[..., Any]) -> list[Any]:
    """The rule's own engine parameters (with their marks) that have fair locks."""
    return [
        param
        for mark in getattr(rule, "pytestmark", [])
        if mark.name == "parametrize" and mark.args[0] == "engine"
        for param in mark.args[1]
        if param.id in FAIR_ENGINES
    ]


def _fair_copy(rule: types.FunctionType) -> types.FunctionType | None:
    """``rule`` as a test of this module, on the fair engines it applies to (None: none)."""
    params = _engine_params(rule)
    if not params:
        return None
    copy = types.FunctionType(
        rule.__code__, rule.__globals__, rule.__name__, rule.__defaults__, rule.__closure__
    )
    copy.__doc__ = rule.__doc__
    others = [mark for mark in getattr(rule, "pytestmark", []) if mark.args[:1] != ("engine",)]
    copy.pytestmark = [*others, pytest.mark.parametrize("engine", params)]  # type: ignore[attr-defined]
    return copy


for _module in (test_contract, test_waiting, test_faults):
    for _name, _rule in vars(_module).items():
        if _name.startswith("test_") and isinstance(_rule, types.FunctionType):
            _copy = _fair_copy(_rule)
            if _copy is not None:
                globals()[_name] = _copy
