"""A leader's term: what both engines' elections share, without I/O."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django_rlock.core.exceptions import LockTimeout

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
