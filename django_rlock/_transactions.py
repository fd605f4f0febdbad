"""A lock released when its transaction ends, not before: ``transaction="auto"``.

::

    with transaction.atomic():
        with rlock(f"account:{account_id}"):
            account = Account.objects.select_for_update(of=()).get(pk=account_id)
            account.balance -= amount
            account.save()
        ...                      # still held: the UPDATE is not committed yet
    # released here, right after COMMIT

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
connection has ended, and gives it back:

* right after ``COMMIT``, as Django's on-commit hooks run (in their order:
  hooks registered inside the block run before the release);
* at ``ROLLBACK`` (also when the ``COMMIT`` itself fails, and when the
  connection is closed inside the transaction), during Django's rollback call.

A savepoint (a nested ``atomic()``) that commits or rolls back changes
nothing: only the outermost transaction's end does. With several databases,
the hold is given back when the last of them ends. ``transaction="ignore"``
gives it back at the block's end, as before.

Django has no rollback hook. The deferred release takes a place in the
connection's on-commit list (:meth:`~django.db.backends.base.base.BaseDatabaseWrapper.on_commit`)
through a small object nothing else refers to. Django empties that list on
rollback (and drops a rolled-back savepoint's entries), and CPython frees an
object the moment nothing refers to it, running its finalizer at once, on the
rolling-back thread: the finalizer gives the hold back or, when only a
savepoint was rolled back and the transaction goes on, takes a new place at
the level that remains.

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

import logging
import weakref

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_rlock.core._sync.locks import RLock
from django_rlock.core.exceptions import LockError, LockLostError

logger = logging.getLogger("django_rlock.lock")


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
        _Spot(connection, release).take_place()


def open_transactions() -> list[BaseDatabaseWrapper]:
    """The calling thread's connections inside a transaction a lock should outlive."""
    return [
        connection
        for connection in connections.all(initialized_only=True)
        if connection.in_atomic_block
        # A TestCase's own atomic blocks never commit (see the module).
        and not getattr(connection.atomic_blocks[0], "_from_testcase", False)
    ]


class _DeferredRelease:
    """One block's hold, given back once each of its transactions has ended."""

    def __init__(self, lock: RLock, transactions: int) -> None:
        self.lock = lock
        self.transactions = transactions

    def ended(self, how: str) -> None:
        """One of the transactions ended (``how``: "committed" or "rolled back")."""
        self.transactions -= 1
        if self.transactions > 0:
            return
        name = self.lock.name
        try:
            self.lock.release()
        except LockLostError:
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


class _Place:
    """The deferred release's entry in one connection's on-commit list.

    Only that list refers to it: when Django drops the entry without calling
    it (a rollback), it is freed at once and its finalizer runs (see the module).
    """

    __slots__ = ("__weakref__", "_spot")

    def __init__(self, spot: _Spot) -> None:
        self._spot = spot

    def __call__(self) -> None:  # Django's on-commit hook: the transaction committed
        self._spot.end("committed")


class _Spot:
    """One connection's wait for its transaction's end, for one deferred release.

    The place's finalizer holds this (never the place itself, which would
    then never be freed).
    """

    def __init__(self, connection: BaseDatabaseWrapper, release: _DeferredRelease) -> None:
        self.connection = connection
        self.release = release
        self.done = False

    def take_place(self) -> None:
        place = _Place(self)
        finalizer = weakref.finalize(place, self.dropped)
        finalizer.atexit = False  # at exit, nothing is rolled back: the server expires it
        self.connection.on_commit(place)

    def end(self, how: str) -> None:
        if not self.done:
            self.done = True
            self.release.ended(how)

    def dropped(self) -> None:
        # The place was freed: after its commit call, or dropped by a rollback.
        if self.done:
            return
        try:
            connection = self.connection
            if connection.in_atomic_block and not connection.closed_in_transaction:
                self.take_place()  # a savepoint rolled back; the transaction goes on
            else:
                self.end("rolled back")
        except Exception:
            # A finalizer's exception would only be printed; never leave the hold behind.
            logger.exception("releasing a lock at its transaction's rollback failed")
            self.end("rolled back")
