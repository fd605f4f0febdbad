"""Leader election: exactly one process (one thread in it) leads; the others stand by.

::

    client = LockClient("redis://127.0.0.1:6379/0")

    with client.leader("billing-daemon") as term:     # waits until elected
        while not term.lost:                          # step down when the term is lost
            run_one_batch(fence=term.token)

The leader is whoever holds the lock called ``name``, taken with no lease, so
the watchdog renews it for as long as the block runs. A standby waits for it
as any waiter does: woken by the leader's release, or, when the leader died,
by the end of its key's life, so a dead leader is replaced within one
watchdog timeout. Waiting is the lock's own (a release message or the
holder's TTL, whichever comes first), never a polling loop.

The thread that enters the block (asyncio: the task) is the leader and must
run the block for the whole term: a hold whose owner thread or task ended is
given back (:mod:`django_rlock.core._process.leaks`), which would end the term.

A term ends in one of two ways:

* the block ends: the lock is released, and a standby is elected at once;
* the term is lost: the lock expired (a pause, Redis unreachable past the
  deadline), another owner took it, or an operator broke it. ``term.lost``
  turns true and the ``term.on_lost`` callbacks run, *before* the lock can
  expire on the server when the watchdog saw renewals fail. The block checks
  ``term.lost`` (or is told by a callback) and leaves. Leaving a lost term
  raises nothing: stepping down is the expected way out.

Entering again after a loss is a new election and a new term, whose fencing
token is higher than every earlier term's, whether or not the lost one was
left first (see :attr:`RLock.lost <django_rlock.core.RLock.lost>`). Pass
``term.token`` with everything the leader writes, and have the store refuse
a token lower than one it has seen: a leader paused past its term cannot then
overwrite its successor's work (docs/fencing.md).

The election's lock describes its holder with the role ``leader``, so
``manage.py rlock list``, ``rlock inspect`` and the admin show the host, pid
and thread of the leader as ``MainThread (leader)``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django_rlock.core._process.holder import holder_details
from django_rlock.core._protocol.leader import LEADER_ROLE, Term, not_elected
from django_rlock.core._protocol.names import check_name, check_timeout
from django_rlock.core.exceptions import LockLostError

if TYPE_CHECKING:
    from django_rlock.core._sync.locks import RLock


logger = logging.getLogger("django_rlock.lock")


class _Terms:
    """Per thread (or task): the terms a :class:`Leadership` entered, newest last."""

    def __init__(self) -> None:
        self._local = threading.local()

    def stack(self) -> list[tuple[Any, Term]]:
        stack: list[tuple[Any, Term]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack


class Leadership:
    """``with client.leader(name) as term:``: wait until elected, lead, step down.

    Made by :meth:`LockClient.leader` (and ``django_rlock.leader``). ``timeout``
    is the longest wait for election in seconds (None: as long as it takes);
    past it :class:`~django_rlock.core.LockTimeout` is raised. One object may be
    entered by several threads, each its own candidate. A thread that enters
    it again while leading re-enters its term (same token).
    """

    def __init__(
        self, name: str, make_lock: Callable[[], RLock], *, timeout: float | None = None
    ) -> None:
        self.name = check_name(name)
        self.timeout = check_timeout(timeout)
        # A lock object per term: its on_lost callbacks then speak of that term alone.
        self._make_lock = make_lock
        self._terms = _Terms()

    def __repr__(self) -> str:
        return f"<Leadership {self.name!r}>"

    def __enter__(self) -> Term:
        lock = self._make_lock()
        with holder_details(role=LEADER_ROLE):
            elected = lock.acquire(timeout=self.timeout)
        if not elected:
            raise not_elected(self.name, self.timeout)
        # The hold was granted to this thread just now: it has a token.
        token = lock.token
        assert token is not None
        me = threading.get_ident()
        term = Term(self.name, token, lost_here=lambda: threading.get_ident() == me and lock.lost)
        lock.on_lost(lambda _lock: term.lose())
        if lock.lost:  # lost before its callback was there to tell the term
            term.lose()
        self._terms.stack().append((lock, term))
        return term

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        lock, term = self._terms.stack().pop()
        term.end()
        try:
            lock.release()
        except LockLostError:
            # Stepping down from a lost term is the expected way out: the loss
            # was told (term.lost, on_lost, the lock_lost signal), not raised.
            term.lose()
