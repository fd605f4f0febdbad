"""``rlock()``: a lock of a configured alias, as a context manager.

::

    from django_rlock import rlock

    with rlock(f"order:{order_id}", timeout=5) as lock:
        charge(order_id, fence=lock.token)

It is ``locks[using].lock(name, ...)``: the RLock itself, whose ``with``
waits up to ``timeout`` seconds (None: as long as it takes) and raises
:class:`~django_rlock.exceptions.LockTimeout` when the wait runs out.

Given fields, the name is a template formatted as ``@locked`` formats one,
and the metrics count the lock under the template, not under each name::

    with rlock("order:{order_id}", order_id=order.pk, timeout=5):
        ...

A name given without fields that still holds a bare ``{field}`` (the ``f``
forgotten: every order would share one lock) is warned about once per name
(:class:`~django_rlock._keys.UnformattedNameWarning`, a RuntimeWarning).

In async code, ``async with rlock(...) as lock`` takes the backend's asyncio
twin of the lock instead, owned by the current task (on the Redis backend an
:class:`~django_rlock.core.aio.AsyncRLock`; nothing blocks the event loop)::

    async with rlock(f"order:{order_id}", timeout=5) as lock:
        await charge(order_id, fence=lock.token)
"""

from __future__ import annotations

from django_rlock import _conf as conf
from django_rlock._handler import locks
from django_rlock._keys import format_name, warn_unformatted
from django_rlock.backends._locks import AliasLock
from django_rlock.backends._semaphores import AliasSemaphore
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS


def rlock(
    name: str,
    /,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    timeout: float | None = None,
    lease: float | None = None,
    blocking: bool = True,
    transaction: str | None = None,
    max_hold: float | None = None,
    **fields: object,
) -> AliasLock:
    """The reentrant lock ``name`` of alias ``using``, ready for ``with`` and ``async with``.

    With ``fields``, ``name`` is a template: ``rlock("order:{order_id}",
    order_id=42)`` is the lock ``order:42``, built as ``@locked`` builds its
    names (a name past the longest is hashed, never truncated), and counted
    in the metrics under ``lock="order:{order_id}"``. A template that needs a
    field not given, or is given one it does not use, raises ValueError.
    Without fields the name is used as it is; one that holds a bare
    ``{field}`` warns once (:class:`~django_rlock._keys.UnformattedNameWarning`),
    unless it opens the name as a Redis hash tag (``{tenant}:orders``).

    ``timeout`` is the longest wait in seconds (None: wait as long as it
    takes), ``lease`` a fixed expiry in seconds (None: the watchdog renews the
    lock until it is released), ``blocking=False`` a single attempt.
    ``transaction="auto"`` keeps a hold whose block ends inside
    ``transaction.atomic()`` until that transaction commits or rolls back,
    ``"ignore"`` releases it as the block ends (None: the alias's
    ``TRANSACTION``, ``"auto"`` by default; see :mod:`django_rlock._scopes.transactions`).
    ``max_hold`` bounds the hold in seconds: past it the watchdog stops
    renewing it and it is declared lost (None: the alias's ``MAX_HOLD``).
    """
    template = None
    if fields:
        template, name = name, format_name(name, fields)
    else:
        warn_unformatted(name, stacklevel=2)
    backend = locks[using]
    if timeout is None and lease is None and blocking is True and max_hold is None:
        lock = backend.lock(name)  # the defaults: no keyword to pass down and check
    else:
        lock = backend.lock(
            name, timeout=timeout, lease=lease, blocking=blocking, max_hold=max_hold
        )
    if template is not None:
        lock.key_template = template  # the metrics' ``lock`` label, as @locked's
    if transaction is not None:
        lock.transaction = conf.transaction(using, transaction)
    return lock


def semaphore(
    name: str,
    permits: int,
    *,
    using: str = DEFAULT_LOCK_ALIAS,
    timeout: float | None = None,
    lease: float | None = None,
    blocking: bool = True,
) -> AliasSemaphore:
    """The semaphore ``name`` of ``permits`` permits of alias ``using``, ready for ``with``.

    Each ``with`` holds one permit, renewed by the watchdog (or for a fixed
    ``lease``); ``timeout`` and ``blocking`` are as for :func:`rlock`. In
    async code, ``async with`` takes the asyncio twin, owned by the task::

        with semaphore(f"partner-api:{tenant}", 3, timeout=5):
            call_partner()
    """
    return locks[using].semaphore(name, permits, timeout=timeout, lease=lease, blocking=blocking)
