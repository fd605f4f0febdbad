"""Calls made by a task of their own: the task that calls ``acquire()`` owns the hold.

``asyncio.create_task(lock.acquire())`` calls ``acquire()`` in the *current*
task, which owns what it grants (the owner is bound at the call, so that
``asyncio.wait_for`` and ``shield`` keep it). A test that wants a rival task
creates it around one of these, so the call is made inside it.
"""

from __future__ import annotations

from typing import Any


async def acquire_in_task(lock: Any, *args: Any, **kwargs: Any) -> bool:
    """``await lock.acquire(*args, **kwargs)``, called by the task that runs this."""
    result: bool = await lock.acquire(*args, **kwargs)
    return result


async def release_in_task(lock: Any) -> None:
    """``await lock.release()``, called by the task that runs this."""
    await lock.release()
