"""A lock released when its transaction ends, not before: ``transaction="auto"``.

::

    with transaction.atomic():
        with rlock(f"account:{account_id}"):
            account = Account.objects.select_for_update(of=()).get(pk=account_id)
            account.balance -= amount
            account.save()
        ...                      # still held: the UPDATE is not committed yet
    # released here, after COMMIT (and the transaction's on-commit hooks)

A lock given back as its ``with`` block ends, while the transaction that
carries the block's writes is still open, lets the next holder read the rows
before they are committed: it reads the old balance, and one update is lost.
Every locked view does exactly that under ``ATOMIC_REQUESTS = True``, where
Django commits after the view returns. A fencing token does not help: the
next holder's stale read comes with a newer, valid token.

So, with ``transaction="auto"`` (the default; ``RLOCK_TRANSACTION`` or
``RLOCKS[alias]["TRANSACTION"]``), a ``with`` block (or an ``@locked`` call)
that ends while a database connection of the calling thread is inside an
atomic block keeps its hold until the outermost transaction of every such
connection has ended, and gives it back, on the thread that holds it:

* after ``COMMIT``, once Django has run the transaction's on-commit hooks,
  or one of them raised (Django then skips the rest), or they never started;
* at ``ROLLBACK`` (also after a failed ``COMMIT``), as Django's rollback
  call returns;
* at a ``close()`` of the connection inside the transaction (by hand, by
  ``close_old_connections()`` or ``close_if_unusable_or_obsolete()``): the
  database rolls the transaction back, and the hold goes as the call returns.

A savepoint (a nested ``atomic()``) that commits or rolls back changes
nothing: only the outermost transaction's end does. With several databases,
the hold is given back when the last of them ends. Autocommit turned off by
hand before ``atomic()``: the hold goes at the ``commit()`` or
``rollback()`` that ends that transaction. ``transaction="ignore"`` gives it
back at the block's end, as before.

How the end is seen. Django has no transaction-end hook, and nothing here
waits for the garbage collector. The first deferred release on a connection
object wraps, once, that object's own ``commit``, ``rollback``, ``close``
and ``set_autocommit`` (instance attributes calling the originals, so a
backend's overrides still run). A release waits in that connection's list
for the transaction open when its block ended, and each call that ends that
transaction empties the list:

* ``atomic()``'s COMMIT moves the list aside; the ``set_autocommit(True)``
  that ``atomic()`` always calls next runs the on-commit hooks, and gives the
  holds back in its ``finally``. After the hooks, not before them: hooks
  registered inside the lock's block (a cache refresh, a task sent) then run
  while it is held, in the order of the transactions; and a hook that raises
  cannot keep it. A slow hook holds the lock longer.
* A successful ROLLBACK, and a ``close()`` after which the connection is
  closed (or marked closed in its transaction), give them back at once. A
  failed COMMIT gives back nothing by itself: ``atomic()`` rolls back next,
  or, when that fails too, closes the connection. (An in-memory SQLite
  database ignores ``close()``: its transaction goes on, and so does the hold.)

Several blocks ending in one transaction are given back last first, as
``with`` blocks unwind. Measured on PostgreSQL (tests/django/test_transaction_ends.py,
``test_release_delays``; medians of 40, three runs, a loaded 2-core
machine): the release is done 0.48-0.49 ms after COMMIT returned,
0.32-0.39 ms after ROLLBACK and 0.35-0.40 ms after the close (one round
trip to the lock server); a rival waiting in ``acquire()`` is granted
0.96-1.09, 0.85-0.94 and 0.86-1.03 ms after them.

A release never fires on a guess: it belongs to one transaction of one
connection and to one hold. When it cannot be settled it is logged as an
ERROR and the hold is kept, as any hold its owner has not given back: the
transaction ended on another thread (a connection shared between threads:
only the holding thread may give its hold back); the thread's hold is no
longer the one the block left (given back by hand, then taken anew: that new
hold is not this release's); autocommit came back on without a COMMIT or
ROLLBACK seen to complete (a COMMIT that raised what is not a database error).

What is guaranteed between the block's end and COMMIT: the hold is still
held and renewed; if it is lost meanwhile (its server unreachable past the
watchdog timeout, a force-release), the transaction still commits, since it
is too late to stop it, and the loss is logged as an ERROR when the release
finds it (the ``lock_lost`` signal has been sent already). A hold already
known lost when the block ends raises :class:`~django_rlock.exceptions.LockLostError`
from the block, inside the transaction, so the ``atomic()`` around it rolls back.

Not bound to a transaction: ``lock.release()`` called by hand (always at
once), asyncio locks (``async with``: Django runs no transaction across an
``await``), and the transactions of Django's ``TestCase``, which never commit:
there a block gives its hold back as it ends (use ``TransactionTestCase``, or
pytest-django's ``transaction=True``, to test the binding).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from asgiref import local as asgiref_local
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_rlock.core import RLock
from django_rlock.core.exceptions import LockError, LockLostError

logger = logging.getLogger("django_rlock.lock")

#: Where a watched connection keeps its :class:`_Watch`.
_WATCH = "_django_rlock_transaction_watch"

#: The class of the thread-critical Local that holds Django's connections
#: (asgiref 3.9 and later; None before, where the Local is read as it is).
_THREAD_CRITICAL_LOCAL: type | None = getattr(asgiref_local, "_ThreadCriticalLocal", None)
_object_getattribute = object.__getattribute__


def end_block(lock: RLock, mode: str) -> None:
    """End one ``with`` block of ``lock`` by the calling thread (``mode``: auto or ignore).

    Gives the hold back now, or, under ``"auto"`` with a transaction open,
    when it ends (see the module). A hold known lost raises LockLostError now.
    """
    if mode == "ignore":
        lock.release()
        return
    open_now = open_transactions()
    if not open_now or lock.lost:
        lock.release()
        return
    release = _DeferredRelease(lock, len(open_now))
    for connection in open_now:
        _watch(connection).waiting.append(release)


def when_released(lock: RLock, callback: Callable[[bool], object]) -> bool:
    """Call ``callback(lost)`` once the calling thread's pending release of ``lock`` has run.

    ``lost``: the release found the hold lost. For a view that answers after
    its transaction's end (the release runs from it, on this thread, after
    the on-commit hooks). False when no release of ``lock`` is pending here;
    a release that never runs (its transaction ended on another thread)
    never calls it.
    """
    for connection in open_transactions():
        watch = getattr(connection, _WATCH, None)
        for release in watch.waiting if watch is not None else ():
            if release.lock is lock:
                release.listeners.append(callback)
                return True
    return False


def open_transactions() -> list[BaseDatabaseWrapper]:
    """The calling thread's connections inside a transaction a lock should outlive."""
    return [
        connection
        for connection in _initialized()
        if connection.in_atomic_block
        # Closed inside its atomic block: the database has rolled it back already.
        and not connection.closed_in_transaction
        # A TestCase's own atomic blocks never commit (see the module).
        and not getattr(connection.atomic_blocks[0], "_from_testcase", False)
    ]


def _initialized() -> list[BaseDatabaseWrapper]:
    """``connections.all(initialized_only=True)``, reading each alias's connection once.

    Asked at the end of every ``with`` block: Django's own reads the handler's
    per-thread storage twice per alias (``hasattr``, then the item), and that
    storage (asgiref's ``Local``) is most of the cost of ending a block.
    """
    local = getattr(connections, "_connections", None)
    if local is None:  # a handler that keeps them elsewhere: Django's own way
        return list(connections.all(initialized_only=True))
    if type(local) is _THREAD_CRITICAL_LOCAL and asyncio._get_running_loop() is None:
        # What asgiref's thread-critical Local reads in a thread running no
        # event loop: its threading.local. Read here directly, as each read
        # through the Local costs two exceptions (attribute lookup, then
        # get_running_loop()), about half of ending a block.
        storage = _object_getattribute(local, "_storage")
        if isinstance(storage, threading.local):
            local = storage
    made = []
    for alias in connections:
        connection = getattr(local, alias, None)
        if connection is not None:
            made.append(connection)
    return made


class _DeferredRelease:
    """One block's hold, given back on its thread once each of its transactions has ended."""

    def __init__(self, lock: RLock, transactions: int) -> None:
        self.lock = lock
        self.transactions = transactions
        self.thread = threading.get_ident()
        #: The hold this release belongs to (None: a semaphore's permit, which has no token).
        self.token = lock.token
        #: Told whether the release found the hold lost (see when_released).
        self.listeners: list[Callable[[bool], object]] = []

    def ended(self, how: str) -> None:
        """One of its transactions ended (``how``: "committed", "rolled back", ...)."""
        name = self.lock.name
        if threading.get_ident() != self.thread:
            # A thread can only give back its own holds: never release as another.
            logger.error(
                "lock %r is kept: its transaction %s on another thread than the one "
                "holding it, which alone may give it back",
                name,
                how,
            )
            return
        self.transactions -= 1
        if self.transactions > 0:
            return
        if self.token is not None and self.lock.token != self.token:
            logger.error(
                "lock %r: after its transaction %s, the hold its block left is no longer "
                "the thread's newest (given back by other code, or taken anew): nothing "
                "released",
                name,
                how,
            )
            return
        lost = False
        try:
            self.lock.release()
        except LockLostError:
            lost = True
            logger.error(
                "lock %r was lost before its transaction %s: what the transaction wrote "
                "was written without the lock held to the end",
                name,
                how,
            )
        except LockError as error:
            logger.warning(
                "could not release lock %r after its transaction %s (%s): it expires by itself",
                name,
                how,
                error,
            )
        for listener in self.listeners:
            listener(lost)


def _settle(releases: list[_DeferredRelease], how: str) -> None:
    """Tell ``releases`` their transaction ended; the last block's first, as ``with`` unwinds."""
    for release in reversed(releases):
        try:
            release.ended(how)
        except Exception:
            # Runs inside Django's commit, rollback or close: never hide what they raise.
            logger.exception(
                "giving lock %r back after its transaction %s failed", release.lock.name, how
            )


def _watch(connection: BaseDatabaseWrapper) -> _Watch:
    """``connection``'s watch, installed on its first deferred release."""
    watch = vars(connection).get(_WATCH)
    if watch is None:
        watch = _Watch(connection)
    assert isinstance(watch, _Watch)
    return watch


class _Watch:
    """The ends of one connection's transactions, seen by the connection's own methods.

    Installed once per connection object: its ``commit``, ``rollback``,
    ``close`` and ``set_autocommit`` become this watch's, which call the
    connection's own and then settle the releases waiting for the transaction
    that call ended (see the module for each path).
    """

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        #: Releases waiting for the open transaction's end, in their blocks' order.
        self.waiting: list[_DeferredRelease] = []
        #: Committed by ``atomic()``: settled as its ``set_autocommit(True)`` ends.
        self.committed: list[_DeferredRelease] = []
        self._commit = connection.commit
        self._rollback = connection.rollback
        self._close = connection.close
        self._set_autocommit = connection.set_autocommit
        for method in ("commit", "rollback", "close", "set_autocommit"):
            setattr(connection, method, getattr(self, method))
        setattr(connection, _WATCH, self)

    def commit(self) -> None:
        connection = self.connection
        self._settle_committed()
        # Inside an atomic block Django refuses the call: no transaction ends.
        ends = not connection.in_atomic_block
        self._commit()
        if not ends or not self.waiting:
            return
        committed, self.waiting = self.waiting, []
        if connection.commit_on_exit:
            # atomic()'s own COMMIT: its set_autocommit(True) follows at once,
            # runs the on-commit hooks, and then these are given back.
            self.committed += committed
        else:
            # A COMMIT by hand (autocommit turned off before atomic()):
            # Django runs no hooks until autocommit is turned back on.
            _settle(committed, "committed")

    def rollback(self) -> None:
        self._settle_committed()
        ends = not self.connection.in_atomic_block
        # A failed ROLLBACK ends nothing here: atomic() closes the connection next.
        self._rollback()
        if ends:
            self._end("rolled back")

    def close(self) -> None:
        connection = self.connection
        self._settle_committed()
        try:
            self._close()
        finally:
            # An in-memory SQLite database ignores close(): its transaction goes on.
            if connection.closed_in_transaction or connection.connection is None:
                self._end("rolled back (its connection was closed)")

    def set_autocommit(
        self, autocommit: bool, force_begin_transaction_with_broken_autocommit: bool = False
    ) -> None:
        if not autocommit:
            self._set_autocommit(autocommit, force_begin_transaction_with_broken_autocommit)
            return
        committed, self.committed = self.committed, []
        try:
            self._set_autocommit(autocommit, force_begin_transaction_with_broken_autocommit)
        finally:
            # After the on-commit hooks, whether they ran, raised, or never started.
            _settle(committed, "committed")
        if self.waiting:
            # Autocommit is back on (SQLite and MySQL commit what was pending;
            # PostgreSQL refuses inside a transaction) without a COMMIT or
            # ROLLBACK seen to complete: atomic()'s COMMIT raised what is not a
            # database error. Keep rather than guess, and let nothing fire later.
            unsettled, self.waiting = self.waiting, []
            for release in unsettled:
                logger.error(
                    "lock %r is kept: its transaction ended without a COMMIT or ROLLBACK "
                    "completing, so whether it wrote anything is unknown",
                    release.lock.name,
                )

    def _settle_committed(self) -> None:
        # Committed, but the set_autocommit(True) that gives them back never
        # came (it always does, after atomic()'s COMMIT): the COMMIT is a fact.
        if self.committed:
            committed, self.committed = self.committed, []
            _settle(committed, "committed")

    def _end(self, how: str) -> None:
        ended, self.waiting = self.waiting, []
        _settle(ended, how)
