"""The key layouts a client speaks, and which lock kinds each one offers (no I/O).

``LockClient(connection, layout=...)`` and the ``RLOCKS`` key ``LAYOUT``:

* ``"rlock"`` (the default): this library's own keys, ``<prefix>:{<name>}``
  and its siblings (:mod:`~django_rlock.core._protocol.names`). Every kind.
* ``"redisson"``: Redisson's keys, hash fields, channel and messages, so that
  a lock is shared with a Java service's ``RLock`` of the same name
  (:mod:`~django_rlock.core._protocol.redisson`, docs/redisson.md). The plain
  lock (and what is built on it: leader terms, MultiLock) interoperates; the
  fair lock, the read-write lock and the semaphore are refused when they are
  made, with what to use instead (:func:`refusal`), as Redisson's versions of
  them follow other rules than ours.

``sharded_subscription`` (Redisson's ``ShardedSubscriptionMode``): whether
releases are announced with SPUBLISH (waiters SSUBSCRIBE) or PUBLISH.
``"auto"`` (default, as Redisson's): SPUBLISH on a Redis Cluster whose primaries
are all >= 7, PUBLISH otherwise; ``"on"``: SPUBLISH everywhere (Redis >= 7);
``"off"``: PUBLISH everywhere. Both sides of a shared lock must agree.
"""

from __future__ import annotations

#: This library's own layout (the default).
RLOCK = "rlock"


#: Redisson's layout: locks shared with Java services running Redisson.
REDISSON = "redisson"


LAYOUTS = (RLOCK, REDISSON)


#: The values of ``sharded_subscription`` (Redisson's ShardedSubscriptionMode, lower case).
SHARDED_SUBSCRIPTION_MODES = ("auto", "on", "off")


def check_layout(layout: object) -> str:
    """``layout``, if it is one of :data:`LAYOUTS`; else ValueError naming them."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, LAYOUTS))}, got {layout!r}")
    return str(layout)


def check_sharded_subscription(mode: object) -> str:
    """``mode``, if it is one of :data:`SHARDED_SUBSCRIPTION_MODES`; else ValueError."""
    if mode not in SHARDED_SUBSCRIPTION_MODES:
        raise ValueError(
            "sharded_subscription must be one of "
            f"{', '.join(map(repr, SHARDED_SUBSCRIPTION_MODES))} (Redisson's "
            f"ShardedSubscriptionMode AUTO, ON, OFF), got {mode!r}"
        )
    return str(mode)


#: Why a kind is not offered in Redisson's layout, and what to use instead.
_NOT_IN_REDISSON = {
    "fair_lock": (
        "Redisson's RFairLock queues its waiters in a list and a sorted set of deadlines "
        "taken from each Java client's own wall clock (fairLockWaitTimeout, 5 minutes by "
        "default), and wakes only the queue's head on a channel of its own; this library's "
        "fair lock does not speak that protocol, so neither side would see the other's queue"
    ),
    "read_write_lock": (
        "Redisson's RReadWriteLock keeps a 'mode' field, its readers and its writer in the "
        "lock's hash, and one timeout key per read hold; this library's read-write lock "
        "does not write those, so a Java writer and a Python reader would both get in"
    ),
    "semaphore": (
        "Redisson's RPermitExpirableSemaphore gives each permit a fixed lease and renews "
        "none (no watchdog): a permit taken without a lease never comes back when its "
        "holder dies, while this library's semaphore promises a dead holder's permit back "
        "within the watchdog timeout, so its permits would not be Redisson's"
    ),
}


#: What each kind is called in messages (``kind`` itself is its factory on the client).
_NOUN = {
    "lock": "lock",
    "fair_lock": "fair lock",
    "read_write_lock": "read-write lock",
    "semaphore": "semaphore",
}


def refusal(kind: str, spoken: str, layout: str, name: str) -> ValueError:
    """The error for a lock of ``kind`` speaking ``spoken``, made on a ``layout`` client.

    ``kind`` is the factory that makes it (``"fair_lock"``...). A kind the
    Redisson layout does not offer says why, and what to use instead.
    """
    if layout == REDISSON and kind in _NOT_IN_REDISSON:
        return ValueError(
            f"{kind}({name!r}) is not offered with layout='redisson': "
            f"{_NOT_IN_REDISSON[kind]}. Use lock({name!r}) to share Redisson's RLock of that "
            f"name, or a client with layout='rlock' for a {_NOUN[kind]} that only Python "
            "processes use"
        )
    return ValueError(
        f"a {_NOUN.get(kind, kind)} object speaking the {spoken!r} layout cannot be made on "
        f"a client with layout={layout!r} ({name!r}): make it with the client's own "
        f"{kind}() method, which builds the kind its layout offers"
    )
