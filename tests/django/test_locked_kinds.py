"""``@locked(..., fair=True)`` and ``@locked(..., mode="read" | "write")`` hold those kinds.

Each holds the kind it names (checked from inside the call, on the server's
side of the lock), sync and async; the choices exclude each other.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from django_rlock import locked, locks

HANG = 10.0


def in_other_thread(call: Callable[[], Any]) -> Any:
    """``call()`` on a thread of its own: another owner than the test's."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    thread.join(HANG)
    return result[0]


def test_mode_read_lets_readers_share_and_shuts_writers_out() -> None:
    rw = locks["default"].read_write_lock("doc:1")

    @locked("doc:{doc_id}", mode="read", timeout=0)
    def show(doc_id: int) -> tuple[bool, bool]:
        another_reader = in_other_thread(lambda: _try_and_release(rw.read))
        writer = in_other_thread(lambda: _try_and_release(rw.write))
        return another_reader, writer

    assert show(1) == (True, False)
    assert not rw.write.locked()


def test_mode_write_shuts_readers_out() -> None:
    rw = locks["default"].read_write_lock("doc:2")

    @locked("doc:{doc_id}", mode="write", timeout=0)
    def edit(doc_id: int) -> bool:
        return bool(in_other_thread(lambda: _try_and_release(rw.read)))

    assert edit(2) is False
    assert in_other_thread(lambda: _try_and_release(rw.read)) is True


def test_fair_true_holds_the_fair_lock_not_the_plain_one() -> None:
    fair = locks["default"].fair_lock("queue:3")
    plain = locks["default"].lock("queue:3")

    @locked("queue:{n}", fair=True, timeout=0)
    def work(n: int) -> tuple[bool, bool]:
        return fair.locked(), plain.locked()

    assert work(3) == (True, False)
    assert not fair.locked()


def test_async_kinds_hold_their_side() -> None:
    rw = locks["default"].read_write_lock("doc:4")

    @locked("doc:{doc_id}", mode="write", timeout=0)
    async def edit(doc_id: int) -> bool:
        return rw.write.locked()

    @locked("doc:{doc_id}", fair=True, timeout=0)
    async def queued(doc_id: int) -> bool:
        return locks["default"].fair_lock("doc:4").locked()

    assert asyncio.run(edit(4)) is True
    assert asyncio.run(queued(4)) is True
    assert not rw.write.locked()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fair": True, "mode": "read"}, "fair and mode"),
        ({"permits": 2, "fair": True}, "permits and fair"),
        ({"mode": "exclusive"}, "mode must be"),
        ({"fair": "yes"}, "fair must be"),
        ({"transaction": "later"}, "transaction must be"),
        ({"max_hold": -1}, "max_hold"),
    ],
)
def test_choices_are_checked_when_decorating(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        locked("doc:{doc_id}", **options)


def _try_and_release(side: Any) -> bool:
    if side.acquire(blocking=False):
        side.release()
        return True
    return False
