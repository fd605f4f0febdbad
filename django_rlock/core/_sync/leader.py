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
from django_rlock.core._protocol.names import check_name, check_timeout
from django_rlock.core.exceptions import LockLostError, LockTimeout

if TYPE_CHECKING:
    from django_rlock.core._sync.locks import RLock


logger = logging.getLogger("django_rlock.lock")


#: The ``role`` an election's lock describes its holder with (see
#: :mod:`~django_rlock.core._process.holder`).
LEADER_ROLE = "leader"


#: Called with the term that was lost.
TermCallback = Callable[["Term"], object]


def not_elected(name: str, timeout: float | None) -> LockTimeout:
    """The error of a candidate that was not elected within ``timeout`` seconds."""
    return LockTimeout(
        f"not elected leader of {name!r} within {timeout}s: another process leads it",
        name=name,
    )


class Term:
    """One term of office, from election to stepping down: what ``leader()`` yields.

    ``name`` is the election's, ``token`` this term's fencing token: higher
    than every earlier term's of the same election. :attr:`lost` and
    :meth:`on_lost` tell the leader that its term is over.
    """

    def __init__(
        self,
        name: str,
        token: int,
        *,
        lost_here: Callable[[], bool],
        run: Callable[[TermCallback, Term], None] | None = None,
    ) -> None:
        self.name = name
        self.token = token
        # Whether the lock, read by the leader's own thread or task, finds the
        # hold lost (its deadline passed): sees a loss before the watchdog says it.
        self._lost_here = lost_here
        self._run = run or _call
        self._mutex = threading.Lock()
        self._lost = False
        self._ended = False
        self._told = False
        self._callbacks: list[TermCallback] = []

    def __repr__(self) -> str:
        state = "lost" if self._lost else ("ended" if self._ended else "leading")
        return f"<Term {self.name!r} token={self.token} {state}>"

    @property
    def lost(self) -> bool:
        """True once this term was lost; it never turns false again (a new election is a new term).

        From any thread it turns true when the loss is declared (by the
        watchdog, before the lock can expire on the server, or by a release);
        read by the leader's own thread or task, also as soon as the term's
        deadline has passed. A term that ended by leaving the block is not lost.
        """
        if not self._lost and not self._ended and self._lost_here():
            self._lost = True
        return self._lost

    def on_lost(self, callback: TermCallback) -> None:
        """Call ``callback(term)`` once when this term is lost.

        It runs on a short-lived thread of its own (asyncio: on the leader's
        event loop; a coroutine function then runs as a task). Registered on a
        term already lost, it runs at once, on the calling thread.
        """
        with self._mutex:
            if not self._told:
                self._callbacks.append(callback)
                return
        self._run(callback, self)

    def lose(self) -> None:
        """Mark the term lost and run its callbacks (once); called by the election's lock."""
        with self._mutex:
            self._lost = True
            if self._told:
                return
            self._told = True
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                self._run(callback, self)
            except Exception:
                logger.exception("term on_lost callback %r failed", callback)

    def end(self) -> None:
        """The block was left: from now on :attr:`lost` changes only if the release found a loss."""
        self._ended = True


def _call(callback: TermCallback, term: Term) -> None:
    callback(term)


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
