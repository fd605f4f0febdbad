"""The semaphore's Lua scripts and their calls, without I/O.

A semaphore of ``permits`` is kept as one small HASH per owner holding
permits, plus an index SET naming those owners; every key shares the name's
hash slot (the library owns the hash tag, as for locks)::

    <prefix>:{<name>}:sem                  SET     owners holding permits (the index)
    <prefix>:{<name>}:sem:permit:<owner>   HASH    owner -> permits, '~holder', '~task', '~since'
    <prefix>:{<name>}:sem:waiters          ZSET    waiter id -> expiry (ms): who to wake next
    <prefix>:{<name>}:sem:released         CHANNEL a message naming a waiter when a permit frees
    <prefix>:{<name>}:sem:req:<owner>      STRING  the owner's last request id (lost replies)
    <prefix>:{<name>}:sem:fence            never written: a semaphore has no fencing counter

Each owner's permit hash has the shape of a lock hash (field owner -> count,
with a TTL: the lease, or the watchdog timeout renewed by the watchdog), so
the hold registry, the watchdog and :data:`~django_rlock.core._protocol.lock.RENEW`
renew permits exactly as they renew locks: one batched renewal path. RENEW
also touches the ``fence`` key it is given; the semaphore names one that is
never written, and PEXPIRE of a missing key does nothing.

A holder that dies stops renewing; its permit hash expires within the
watchdog timeout, and the next acquire prunes it from the index, so its
permits come back. The scripts read the other owners' permit hashes through
names built from the index (not passed in KEYS): they are all in the
semaphore's one slot, which a cluster node serves whole.

How the scripts are composed: from the shared rules of
:mod:`~django_rlock.core._protocol.lua` (each a function whose keyword
arguments name the keys it works on, e.g. ``release_hold(hold="KEYS[2]",
latch="5")``) and the semaphore's own pieces, written the same way: a
:class:`string.Template` with named fields (``$prefix``, ``$waiters``,
``$latch_ms``, ...) that a function, or the script, fills by name with
``substitute``.
"""

from __future__ import annotations

from collections.abc import Mapping
from string import Template
from typing import Any, Unpack

from django_rlock.core._process import lostholds
from django_rlock.core._process.holder import describe
from django_rlock.core._protocol.calls import ScriptCall, attempt_args
from django_rlock.core._protocol.deadlocks import SEMAPHORE, Wait
from django_rlock.core._protocol.lock import LockOptions, MakeScript, ScriptSet, gave_up_after
from django_rlock.core._protocol.lockbase import LockBase
from django_rlock.core._protocol.lua import (
    LEAVE_WAITING_SET,
    NOW_MS_LUA,
    REQUEST_LATCH_MS,
    drop_lost_key,
    publish_to_waiter,
    register_waiter,
    release_hold,
    store_holder,
)
from django_rlock.core._protocol.names import LockKeys
from django_rlock.core.exceptions import LockLostError, LockTimeout


def check_permits(permits: object) -> int:
    """``permits``: an int >= 1 (the most owners' permits held at once)."""
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise ValueError(f"permits must be an int >= 1, not {type(permits).__name__}")
    if permits < 1:
        raise ValueError(f"permits must be an int >= 1, got {permits!r}")
    return permits


def semaphore_keys(prefix: str, name: str) -> LockKeys:
    """The keys of semaphore ``name``: ``hash`` is the index SET (see the module's docstring).

    Every key ends in ``:sem...`` after the lock's hash tag, so a semaphore and
    a lock of the same name never share a key, while sharing the slot.
    """
    return LockKeys.around(name, LockKeys.build(prefix, name).hash + ":sem")


def permit_prefix(keys: LockKeys) -> str:
    """What an owner id is appended to, to name that owner's permit hash."""
    return f"{keys.hash}:permit:"


def permit_key(keys: LockKeys, owner: str) -> str:
    """The HASH counting ``owner``'s permits of the semaphore keyed ``keys``."""
    return permit_prefix(keys) + owner


# Counts the permits held now: the sum over the index's members whose permit
# hash still exists. Defines `used` and `soonest` (the smallest PTTL among
# those hashes: when a permit may come back; -1 when none has an expiry, -2
# when nobody holds one). O(members). The members' hashes are named
# $prefix .. member; with $prune, members whose hash is gone (expired: a dead
# holder) leave the index.
_COUNT = Template("""
local used, soonest = 0, -2
for _, member in ipairs(redis.call('smembers', KEYS[1])) do
    local key = $prefix .. member
    local count = redis.call('hget', key, member)
    if count then
        used = used + tonumber(count)
        local pttl = redis.call('pttl', key)
        if pttl >= 0 and (soonest < 0 or pttl < soonest) then
            soonest = pttl
        elseif pttl == -1 and soonest == -2 then
            soonest = -1
        end
    elseif $prune then
        redis.call('srem', KEYS[1], member)
    end
end
""")


def _count(*, prefix: str, prune: bool) -> str:
    return _COUNT.substitute(prefix=prefix, prune="true" if prune else "false")


# Wakes up to $count registered waiters of the set $waiters (expired
# registrations dropped first), those whose sleep ends first, each by a
# message naming it on $channel with the command $publish, counting them in
# `woken`; each woken waiter leaves the set (its next attempt, if busy,
# registers it again), so two permits freed at once wake two waiters, not the
# same one twice.
_WAKE = Template(
    """
local woken = 0
if redis.call('exists', $waiters) == 1 then
"""
    + NOW_MS_LUA
    + """
    redis.call('zremrangebyscore', $waiters, '-inf', now)
    for _, waiter in ipairs(redis.call('zrange', $waiters, 0, $count - 1)) do
        redis.call('zrem', $waiters, waiter)
"""
    + publish_to_waiter(waiter="waiter", channel="$channel", publish="$publish", indent=" " * 8)
    + """        woken = woken + 1
    end
end
"""
)


def _wake(*, waiters: str, channel: str, publish: str, count: str) -> str:
    return _WAKE.substitute(waiters=waiters, channel=channel, publish=publish, count=count)


# KEYS[1] index SET, KEYS[2] the owner's permit hash, KEYS[3] waiting set,
# KEYS[4] (optional) the owner's request latch
# ARGV[1] owner id, ARGV[2] expiry in milliseconds,
# ARGV[3] waiter id ('' for an attempt that will not wait),
# ARGV[4] the longest the waiter will sleep before trying again, in milliseconds,
# ARGV[5] (with KEYS[4]) this call's request id,
# ARGV[6] the owner's permits its client has declared lost (0: none),
# ARGV[7] who asks, for operators (core/holder.py; '' for none),
# ARGV[8] permits: the most held at once, as this caller counts them,
# ARGV[9] the permit-hash prefix (an owner id appended names its hash)
# Returns {0, permits the owner holds now, the owner's hash PTTL in ms} when
#   granted (the shape of scripts.ACQUIRE's grant; a semaphore has no fencing
#   token, hence 0), else the smallest PTTL among the holders' hashes (when a
#   permit may come back; -1 when none expires), and a waiter is (re-)entered
#   in the waiting set until just after its sleep ends, as in scripts.ACQUIRE.
#   Granted when the live permits (the index's members whose hash exists) are
#   fewer than ARGV[8]: one more is counted in the owner's hash (a second
#   permit of the same owner is a second hold, as threading.Semaphore takes
#   two), whose life is set to the expiry but never shortened.
#   Each call counts against its own ARGV[8]: callers that pass different
#   permits for one name each stop at their own number (the smaller never
#   waits for the larger's extra permits, the larger may take permits the
#   smaller would count as over its limit).
#   Lost permits (ARGV[6]): the owner's hash is deleted first, before the
#   latch is read, so the call is a new grant, never a report of permits its
#   owner was told are gone. The owner's hash can only be of the lost grant:
#   a grant through any client of the process forgets the loss (lostholds).
#   A resent call that was already granted (its latch holds its request id)
#   changes nothing and reports the owner's permits and PTTL now. The latch
#   is read with GET and set only by a grant: a busy call must not latch, or
#   its resend would be reported granted.
#
# The index. Acquire prunes the members whose hash is gone before counting,
#   and only a caller that found a permit free adds itself, so the index holds
#   at most as many owners as the largest ``permits`` used for the name
#   (never growing without bound). It has no expiry: it must outlive every
#   member's hash, and those are renewed by the watchdog's RENEW (which does
#   not touch the index) or carry leases of any length, so no TTL set here
#   could be known to outlive them; an index that expired under a live holder
#   would let acquires over-grant. It goes away when its last member does: a
#   release that empties it (SREM of the last member deletes a set), or an
#   acquire or abandon that prunes the last dead member. A name whose holders
#   all died and that is never used again keeps one set of at most
#   ``permits`` dead owner ids; a force_release deletes it.
SEMAPHORE_ACQUIRE = Template(
    """
local ttl = tonumber(ARGV[2])
"""
    + drop_lost_key(key="KEYS[2]", index="KEYS[1]")
    + """
if KEYS[4] and redis.call('hexists', KEYS[2], ARGV[1]) == 1
        and redis.call('get', KEYS[4]) == ARGV[5] then
    return {0, tonumber(redis.call('hget', KEYS[2], ARGV[1])), redis.call('pttl', KEYS[2])}
end
"""
    + _count(prefix="ARGV[9]", prune=True)
    + """
if used < tonumber(ARGV[8]) then
    local holds = redis.call('hincrby', KEYS[2], ARGV[1], 1)
    local left = ttl
    if holds == 1 then
        if ARGV[7] ~= '' then
"""
    + NOW_MS_LUA
    + """
"""
    + store_holder(
        key="KEYS[2]",
        fields="'~since', string.format('%.0f', now)",
        description="ARGV[7]",
        indent="            ",
    )
    + """\
        end
        redis.call('pexpire', KEYS[2], ttl)
        redis.call('sadd', KEYS[1], ARGV[1])
    else
        left = redis.call('pttl', KEYS[2])
        if left >= 0 and left < ttl then
            redis.call('pexpire', KEYS[2], ttl)
            left = ttl
        end
    end
"""
    + LEAVE_WAITING_SET
    + """
    if KEYS[4] then
        redis.call('set', KEYS[4], ARGV[5], 'px', $latch_ms)
    end
    return {0, holds, left}
end
"""
    + register_waiter(wait="soonest")
).substitute(latch_ms=REQUEST_LATCH_MS)


# KEYS[1] index SET, KEYS[2] the owner's permit hash, KEYS[3] waiting set,
# KEYS[4] release channel, KEYS[5] (optional) the owner's request latch
# ARGV[1] owner id, ARGV[2] publish command ('publish' or 'spublish'),
# ARGV[3] (with KEYS[5]) this call's request id
# Returns -1 when the owner holds no permit (nothing is changed), else the
#   owner's permits left; at 0 its hash is deleted and it leaves the index.
#   Every release frees one permit, so it wakes one registered waiter (the
#   one whose sleep ends first), by the rule scripts.RELEASE explains: a
#   waiter sleeps only after an attempt as a registered waiter found no
#   permit, in the same atomic script that registered it. With no waiter,
#   nothing is published.
#   A resent call that was already applied changes nothing and returns the
#   owner's permits now (0 after its last).
SEMAPHORE_RELEASE = (
    release_hold(hold="KEYS[2]", latch="5")
    + """
if holds <= 0 then
    holds = 0
    redis.call('del', KEYS[2])
    redis.call('srem', KEYS[1], ARGV[1])
end
"""
    + _wake(waiters="KEYS[3]", channel="KEYS[4]", publish="ARGV[2]", count="1")
    + """
return holds
"""
)


# KEYS[1] index SET, KEYS[2] waiting set, KEYS[3] release channel
# ARGV[1] waiter id, ARGV[2] publish command, ARGV[3] permits (the caller's),
# ARGV[4] the permit-hash prefix
# A waiter leaves without a permit (its wait ran out, or it was cancelled). A
#   release may have woken it alone: while permits are free, as many other
#   waiters as there are free permits are woken instead.
# Returns how many were woken.
SEMAPHORE_ABANDON = (
    """
redis.call('zrem', KEYS[2], ARGV[1])
if redis.call('zcard', KEYS[2]) == 0 then
    return 0
end
"""
    + _count(prefix="ARGV[4]", prune=True)
    + """
local free = tonumber(ARGV[3]) - used
if free <= 0 then
    return 0
end
"""
    + _wake(waiters="KEYS[2]", channel="KEYS[3]", publish="ARGV[2]", count="free")
    + """
return woken
"""
)


# KEYS[1] index SET
# ARGV[1] the permit-hash prefix
# Returns {permits held now, the smallest PTTL among their hashes in ms (-1:
#   none expires, -2: none held)}. Read-only: dead members are skipped, not pruned.
SEMAPHORE_STATE = (
    _count(prefix="ARGV[1]", prune=False)
    + """
return {used, soonest}
"""
)


# KEYS[1] index SET, KEYS[2] release channel, KEYS[3] waiting set
# ARGV[1] publish command, ARGV[2] the permit-hash prefix
# Deletes every owner's permits and the index, whoever holds them, and wakes
#   every waiter (a message naming nobody). O(members).
# Returns 1 when a permit was held, else 0.
SEMAPHORE_FORCE_RELEASE = """
local held = 0
for _, member in ipairs(redis.call('smembers', KEYS[1])) do
    held = held + redis.call('del', ARGV[2] .. member)
end
redis.call('del', KEYS[1])
if held > 0 or redis.call('exists', KEYS[3]) == 1 then
    redis.call(ARGV[1], KEYS[2], '')
end
if held > 0 then
    return 1
end
return 0
"""


class SemaphoreScripts(ScriptSet):
    """The semaphore's scripts: acquire is plain, the others run under OOM where Redis allows.

    The others give permits back or only read (see
    :class:`~django_rlock.core._protocol.lock.ScriptSet`).
    """

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the semaphore's scripts."""
        self.acquire = plain(SEMAPHORE_ACQUIRE)
        self.release = oom_safe(SEMAPHORE_RELEASE)
        self.abandon = oom_safe(SEMAPHORE_ABANDON)
        self.state = plain(SEMAPHORE_STATE)
        self.force_release = oom_safe(SEMAPHORE_FORCE_RELEASE)


def semaphore_acquire_call(
    keys: LockKeys,
    owner: str,
    *,
    permits: int,
    ttl: float,
    waiter_id: str,
    sleep: float,
    rid: str,
    lost: bool = False,
    holder: str = "",
) -> ScriptCall:
    """One acquire of one permit (:data:`SEMAPHORE_ACQUIRE`)."""
    attempt = attempt_args(owner, ttl=ttl, waiter_id=waiter_id, sleep=sleep, rid=rid)
    return ScriptCall(
        keys=[keys.hash, permit_key(keys, owner), keys.waiters, keys.latch(owner)],
        args=[*attempt, 1 if lost else 0, holder, permits, permit_prefix(keys)],
        rid=rid,
    )


def semaphore_release_call(keys: LockKeys, owner: str, publish: str, rid: str) -> ScriptCall:
    """One release of one permit (:data:`SEMAPHORE_RELEASE`)."""
    return ScriptCall(
        keys=[keys.hash, permit_key(keys, owner), keys.waiters, keys.channel, keys.latch(owner)],
        args=[owner, publish, rid],
        rid=rid,
    )


def semaphore_abandon_call(
    keys: LockKeys, waiter_id: str, publish: str, permits: int
) -> ScriptCall:
    """A waiter leaves without a permit (:data:`SEMAPHORE_ABANDON`)."""
    return ScriptCall(
        keys=[keys.hash, keys.waiters, keys.channel],
        args=[waiter_id, publish, permits, permit_prefix(keys)],
    )


def semaphore_state_call(keys: LockKeys) -> ScriptCall:
    """The permits held now and when the first may come back (:data:`SEMAPHORE_STATE`)."""
    return ScriptCall(keys=[keys.hash], args=[permit_prefix(keys)])


def semaphore_force_release_call(keys: LockKeys, publish: str) -> ScriptCall:
    """Take every permit back (:data:`SEMAPHORE_FORCE_RELEASE`)."""
    return ScriptCall(
        keys=[keys.hash, keys.channel, keys.waiters], args=[publish, permit_prefix(keys)]
    )


def available_reply(permits: int, state: Any) -> int:
    """Free permits, from a state script reply ``{used, soonest}`` (never below 0)."""
    return max(permits - int(state[0]), 0)


def first_return_reply(state: Any) -> float | None:
    """Seconds until the first held permit may come back (None: none held; inf: no expiry)."""
    soonest = int(state[1])
    if soonest == -2:
        return None
    if soonest == -1:
        return float("inf")
    return soonest / 1000


class SemaphoreBase(LockBase):
    """What :class:`Semaphore` and the asyncio ``AsyncSemaphore`` share (no I/O).

    The keys (``keys.hash`` is the index of owners holding permits), each
    owner's permit hash as the key its holds are counted and renewed in, and
    the script calls.
    """

    kind = "semaphore"  # its factory, named when a client's layout refuses it

    def _description_key(self) -> str | None:
        return None  # busy by every permit's holder at once

    def __init__(
        self, client: Any, name: str, permits: int, **options: Unpack[LockOptions]
    ) -> None:
        # `client` is the shell's (LockClient or AsyncLockClient): the shell
        # class after this one in the MRO takes it and finds the engine.
        self.permits = check_permits(permits)
        super().__init__(client, name, **options)
        self.keys = semaphore_keys(self._engine.key_prefix, name)

    def hold_keys(self, owner: str) -> tuple[str, str]:
        """The owner's permit hash, and the never-written fence renewed with it (a no-op)."""
        return permit_key(self.keys, owner), self.keys.fence

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        rid = self._request_id("acquire", owner)
        lost = lostholds.lost_on_server(self.hold_keys(owner)[0], owner) is not None
        return semaphore_acquire_call(
            self.keys,
            owner,
            permits=self.permits,
            ttl=self._ttl_of(lease),
            waiter_id=waiter_id,
            sleep=sleep,
            rid=rid,
            lost=lost,
            holder=describe(lease),
        )

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        return semaphore_release_call(self.keys, owner, self._engine.publish_command, rid)

    def _abandon_call(self, waiter_id: str) -> ScriptCall:
        return semaphore_abandon_call(
            self.keys, waiter_id, self._engine.publish_command, self.permits
        )

    def _state_call(self) -> ScriptCall:
        return semaphore_state_call(self.keys)

    def _force_release_call(self) -> ScriptCall:
        return semaphore_force_release_call(self.keys, self._engine.publish_command)

    def _deadlock_wait(self) -> Wait:
        """A permit: the waiter is stuck only while stuck owners hold them all."""
        return Wait(SEMAPHORE, self.keys.hash, self.permits)

    def _timeout_error(
        self, remaining: float | None, holder: Mapping[str, Any] | None = None
    ) -> LockTimeout:
        return LockTimeout(
            f"could not acquire a permit of semaphore {self.name!r} (permits={self.permits}) "
            f"{gave_up_after(self.blocking, self.timeout)}"
            + ("" if remaining is None else f" (the first may come back in {remaining:.3f}s)"),
            name=self.name,
            retry_after=remaining,
        )

    def _lost_error(self) -> LockLostError:
        return LockLostError(
            f"a permit of semaphore {self.name!r} was lost: it expired before release",
            name=self.name,
        )

    @property
    def token(self) -> None:
        """Always None: permits carry no fencing token (several holders run at once)."""
        return None
