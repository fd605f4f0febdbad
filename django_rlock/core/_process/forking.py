"""What a forked child resets: the one ``os.register_at_fork`` of the package.

``fork()`` copies the memory of the process but only the thread that called
it. A mutex another thread held at that moment stays held in the child, with
no thread left to release it: the child's first use of it hangs forever. A
Celery prefork pool forks while the parent's watchdog, listeners and handler
may be busy, so every mutex that can be shared by threads is made anew in the
child, along with state that belongs to the parent only (its owner id, its
holds, its renewal thread).

Each module registers its reset here once, at import::

    forking.after_fork_in_child(_reset_after_fork)

and a mutex owned by an object (a client, a backend, a lock group) is renewed
for as long as the object lives::

    self._mutex = threading.Lock()
    forking.renew_after_fork(self, "_mutex")

Resets run in the child, in the order they were registered (a module's
imports register before it does, so the owner id is new before the clients
reset their holds).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

_Reset = TypeVar("_Reset", bound=Callable[[], object])


_resets: list[Callable[[], object]] = []


# id(owner) -> (weak reference to owner, attribute, factory). An entry removes
# itself when its owner is collected, so short-lived owners cost nothing later.
_renewed: dict[int, list[tuple[weakref.ref[Any], str, Callable[[], object]]]] = {}


def after_fork_in_child(reset: _Reset) -> _Reset:
    """Call ``reset()`` in every child forked from now on; returns it (usable as a decorator)."""
    _resets.append(reset)
    return reset


def renew_after_fork(
    owner: object, attribute: str, factory: Callable[[], object] = threading.Lock
) -> None:
    """In a forked child, set ``owner.<attribute>`` to a new ``factory()``.

    ``owner`` is held weakly: the renewal ends with it.
    """
    key = id(owner)

    def forget(_: weakref.ref[Any]) -> None:
        _renewed.pop(key, None)

    entries = _renewed.get(key)
    if entries is None or entries[0][0]() is not owner:
        entries = _renewed[key] = []
    entries.append((weakref.ref(owner, forget), attribute, factory))


def _renew_owned() -> None:
    for entries in list(_renewed.values()):
        for ref, attribute, factory in entries:
            owner = ref()
            if owner is not None:
                setattr(owner, attribute, factory())


def _run_resets() -> None:
    # Runs in the child, where only this thread exists: no lock is needed.
    # One failing reset must not leave the others undone: each runs, and the
    # first error is raised last (Python reports it; the child carries on).
    error: BaseException | None = None
    for reset in (_renew_owned, *_resets):
        try:
            reset()
        except Exception as failure:  # noqa: BLE001 -- raised below, after the other resets
            error = error or failure
    if error is not None:
        raise error


os.register_at_fork(after_in_child=_run_resets)
