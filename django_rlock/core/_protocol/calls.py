"""The lock scripts' calls, without I/O: what each operation sends, and what a reply means.

Both engines build every script call here and read every reply here; their
I/O shells (:mod:`django_rlock.core._sync.locks`, :mod:`django_rlock.core._aio.locks`)
only send the call and hand back the reply. The KEYS/ARGV/returns of each
script are documented beside it in :mod:`django_rlock.core._protocol.lock`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from django_rlock.core._protocol.names import LockKeys, milliseconds
from django_rlock.core._protocol.resp import Template, encoded


class ScriptCall(NamedTuple):
    """The KEYS and ARGV of one script call (``rid``: its request id, '' when it has none).

    A named tuple, not a frozen dataclass: every lock call makes one, and a
    frozen dataclass costs three times as much to build.
    """

    keys: list[str]
    args: list[str | int]
    rid: str = ""


class Grant(NamedTuple):
    """An acquire reply that granted the lock: its token, the owner's holds, the key's PTTL."""

    token: int
    holds: int
    pttl_ms: int


def sleep_ms(sleep: float) -> int:
    """A waiter's announced sleep as ARGV[4] takes it: ms, negated for a starving waiter.

    A starving waiter (its sleep given negated) asks the release to hand it
    the lock (scripts.ACQUIRE).
    """
    return -milliseconds(-sleep) if sleep < 0 else milliseconds(sleep)


def attempt_args(
    owner: str, *, ttl: float, waiter_id: str, sleep: float, rid: str
) -> list[str | int]:
    """ARGV[1..5] of every kind's acquire: owner, expiry ms, waiter id, longest sleep ms, rid."""
    return [owner, milliseconds(ttl), waiter_id, sleep_ms(sleep), rid]


def acquire_args(
    owner: str,
    *,
    ttl: float,
    waiter_id: str,
    sleep: float,
    rid: str,
    lost: tuple[int, int] | None,
    holder: str,
) -> list[str | int]:
    """ARGV[1..8] of scripts.ACQUIRE, which the fair lock and the write side take too.

    ``lost``: (token, holds) of the owner's holds its client has declared lost,
    which the server may still count (see scripts.ACQUIRE). ``holder``: who
    asks, stored by a new grant (:func:`django_rlock.core._process.holder.describe`).
    """
    token, holds = lost or (0, 0)
    # attempt_args, then the lost holds and the holder (inline: every acquire builds one).
    return [owner, milliseconds(ttl), waiter_id, sleep_ms(sleep), rid, holds, str(token), holder]


def acquire_call(
    keys: LockKeys,
    owner: str,
    *,
    ttl: float,
    waiter_id: str,
    sleep: float,
    rid: str,
    lost: tuple[int, int] | None = None,
    holder: str = "",
) -> ScriptCall:
    """One acquire (scripts.ACQUIRE): ``ttl`` seconds of life, ``sleep`` the longest wait.

    ``lost`` and ``holder``: see :func:`acquire_args`. The hash keeps the
    fencing token and the request latch; the name's latches hash has the last
    released token (:func:`counter_acquire_keys` are the keys a sibling kind's
    acquire takes).
    """
    return ScriptCall(
        keys=[keys.hash, keys.waiters, keys.latches],
        args=acquire_args(
            owner, ttl=ttl, waiter_id=waiter_id, sleep=sleep, rid=rid, lost=lost, holder=holder
        ),
        rid=rid,
    )


def counter_acquire_keys(keys: LockKeys, owner: str) -> list[str]:
    """The KEYS of a sibling kind's acquire built on the shared grant (lua.new_grant).

    The hash, its fencing counter, the waiting set and the owner's request
    latch, where the plain lock keeps counter and latch in its hash.
    """
    return [keys.hash, keys.fence, keys.waiters, keys.latch(owner)]


def counter_release_keys(keys: LockKeys, owner: str) -> list[str]:
    """The KEYS of a sibling kind's release built on the shared one (lua.release_one).

    The hash, the channel, the waiting set and the owner's request latch.
    """
    return [keys.hash, keys.channel, keys.waiters, keys.latch(owner)]


def acquire_template(keys: LockKeys, owner: str, ttl: float) -> Template:
    """:func:`acquire_call`'s fixed parts for one owner and life, encoded once.

    :meth:`Template.pack` then takes the script's SHA and the rest of the
    arguments in order: waiter id, sleep in ms, request id, the lost holds'
    count and token (str), the holder (see :func:`acquire_args`).
    """
    return Template([keys.hash, keys.waiters, keys.latches], [owner, milliseconds(ttl)], 6)


#: ARGV[4] of an acquire that does not wait (no waiter id; its sleep is not read).
NOT_WAITING_MS = sleep_ms(0.0)
#: ARGV[3..4] of an acquire that does not wait, encoded: every uncontended
#: acquire's (see :meth:`Template.pack_fresh`).
NOT_WAITING = encoded("", NOT_WAITING_MS)

# holder description -> ARGV[6..8] of an acquire with no lost holds, encoded.
_no_lost_tails: dict[str, bytes] = {}


def no_lost_tail(holder: str) -> bytes:
    """ARGV[6..8] of an acquire by ``holder`` with no lost holds (0, '0', holder), encoded once.

    A thread's description is the same from call to call, so the end of its
    uncontended acquire is too; kept for the last :data:`_TEMPLATES_KEPT` holders.
    """
    tail = _no_lost_tails.get(holder)
    if tail is None:
        if len(_no_lost_tails) >= _TEMPLATES_KEPT:
            _no_lost_tails.clear()
        tail = _no_lost_tails[holder] = encoded(0, "0", holder)
    return tail


def release_template(keys: LockKeys, owner: str, publish: str) -> Template:
    """:func:`release_call`'s fixed parts for one owner: ``pack(sha, rid)`` makes a call."""
    return Template([keys.hash, keys.channel, keys.waiters, keys.latches], [owner, publish], 1)


def extend_call(key: str, fence: str, owner: str, seconds: float) -> ScriptCall:
    """The owner's hold on ``key`` now expires ``seconds`` from the call (scripts.RENEW, exact).

    ``key`` and ``fence`` are the lock's
    :meth:`~django_rlock.core._protocol.lockbase.LockBase.hold_keys`.
    """
    return ScriptCall(keys=[key, fence], args=[milliseconds(seconds), 1, owner])


def release_call(keys: LockKeys, owner: str, publish: str, rid: str) -> ScriptCall:
    """One release of one hold (scripts.RELEASE); ``publish`` is 'publish' or 'spublish'."""
    return ScriptCall(
        keys=[keys.hash, keys.channel, keys.waiters, keys.latches],
        args=[owner, publish, rid],
        rid=rid,
    )


def force_release_call(keys: LockKeys, publish: str) -> ScriptCall:
    """Delete the lock whoever holds it (scripts.FORCE_RELEASE)."""
    return ScriptCall(keys=[keys.hash, keys.channel], args=[publish])


def abandon_call(keys: LockKeys, waiter_id: str, publish: str) -> ScriptCall:
    """A waiter leaves without the lock (scripts.ABANDON)."""
    return ScriptCall(keys=[keys.hash, keys.channel, keys.waiters], args=[waiter_id, publish])


def acquire_reply(reply: Any, no_expiry_wait: float) -> Grant | float:
    """A :class:`Grant`, or the seconds to wait at most before trying again.

    A holder's key with no expiry (written by hand) is looked at again after
    ``no_expiry_wait`` seconds rather than never.
    """
    if isinstance(reply, list):
        token, holds, pttl_ms = reply
        return Grant(int(token), int(holds), int(pttl_ms))
    pttl_ms = int(reply)
    if pttl_ms < 0:
        return no_expiry_wait
    return max(pttl_ms, 1) / 1000


def ttl_reply(pttl_ms: Any) -> float | None:
    """A PTTL reply as ``ttl()`` answers it: seconds, None when unheld, inf with no expiry."""
    pttl = int(pttl_ms)
    if pttl == -2:
        return None
    if pttl == -1:
        return math.inf
    return pttl / 1000


def hold_count_reply(count: Any) -> int:
    """An HGET of the owner's field as ``hold_count()`` answers it (0: no hold)."""
    return 0 if count is None else int(count)


#: How many templates (lock, owner, life) the process keeps before it starts afresh.
_TEMPLATES_KEPT = 4096


# (lock hash key, owner, life, publish command) -> acquire and release templates.
_templates: dict[tuple[str, str, float, str], tuple[Template, Template]] = {}


def kept_templates(
    keys: LockKeys, owner: str, ttl: float, publish: str
) -> tuple[Template, Template]:
    """The acquire (for ``ttl``) and release templates of ``owner``'s plain-lock calls on ``keys``.

    Kept per lock name, not per lock object: the Django face makes a lock
    object per ``with rlock(...)``.
    """
    key = (keys.hash, owner, ttl, publish)
    made = _templates.get(key)
    if made is None:
        if len(_templates) >= _TEMPLATES_KEPT:
            _templates.clear()  # many names or threads came and went: keep the current ones
        made = _templates[key] = (
            acquire_template(keys, owner, ttl),
            release_template(keys, owner, publish),
        )
    return made
