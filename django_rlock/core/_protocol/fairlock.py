"""The fair lock's Lua scripts and their calls: grants in arrival order.

A fair lock is an RLock (same hash, fencing counter, request latch, holder
metadata, renewal) with a queue beside it, in the same hash slot::

    <prefix>:{<escaped name>}:fair           HASH     owner id -> hold count
    <prefix>:{<escaped name>}:fair:fence     STRING   last fencing token granted
    <prefix>:{<escaped name>}:fair:waiters   ZSET     queue id -> entry expiry (server ms)
    <prefix>:{<escaped name>}:fair:queue     ZSET     queue id -> arrival number
    <prefix>:{<escaped name>}:fair:entries   HASH     queue id -> what a handoff needs
    <prefix>:{<escaped name>}:fair:released  CHANNEL  names the head handed the lock
    <prefix>:{<escaped name>}:fair:req:<owner>  STRING  the owner's last request id

The ``:fair`` suffix keeps a fair lock and a plain lock of the same name apart.

The rule: a grant goes to a caller only when the lock is free and the queue,
once its expired entries are dropped, is empty or has the caller at its head.
A blocking caller takes its place (the next arrival number) on its first busy
attempt and keeps it on every later one; each attempt renews its entry until
just after the sleep it is about to take. An entry whose waiter gave up
(ABANDON) goes at once; one whose waiter died or stopped retrying expires at
most the watchdog timeout + :data:`ENTRY_MARGIN_MS` after its last attempt, as
waiters never sleep longer than that (the caller caps each sleep at the watchdog
timeout, see ``_sync/fairlock.py``). The queue id is a waiter id of the caller's
release listener, chosen before the first attempt and then subscribed with, so
a release can name the head and wake it alone.

Handoff: a release that frees the lock grants it at once to the queue's live
head, inside the release script, as a new grant renewed by the watchdog (the
key lives the watchdog timeout), and marks the hash ``~handoff`` = the head's
queue id. The message names the head, the token and the request id of the
head's last attempt (``"<queue id> <token> <request id>"``); the head's busy
attempts store that request id, with its owner id and holder metadata, in
``:fair:entries``. A head that waits with the watchdog and whose last attempt
is the one named holds the lock when the message arrives (no acquire call;
its deadline counts from that attempt's send time, see ``_sync/fairlock.py``).
Any other head (a fixed lease, a lost or stale message) confirms with its next
attempt, which FAIR_ACQUIRE recognises by the marker: it sets the caller's
own expiry and replies a new grant {token, 1, pttl}. A head that gives up
hands the grant on (FAIR_ABANDON); one that died lets it expire within the
watchdog timeout, and the next head's retry finds the lock free.

How the scripts are composed: from the shared rules of
:mod:`~django_rlock.core._protocol.lua` (each a function whose keyword
arguments name the keys it works on) and the fair lock's own Lua, which names
the keys whose place differs between its scripts as ``KEYS[$queue]``,
``KEYS[$entries]`` and ``KEYS[$fence]`` (and the entries' margin
``$margin_ms``): each script is a :class:`string.Template` that
:func:`_fill` fills with that script's own key layout, given by name.
"""

from __future__ import annotations

from collections.abc import Callable
from string import Template
from typing import Any, Protocol

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.calls import (
    ScriptCall,
    abandon_call,
    counter_acquire_keys,
    counter_release_keys,
)
from django_rlock.core._protocol.channels import CarriesHandoff
from django_rlock.core._protocol.lock import KindScripts, MakeScript, ScriptSet, handoff_min_life
from django_rlock.core._protocol.lockbase import LockBase
from django_rlock.core._protocol.lua import (
    CONFIRM_HANDOFF,
    CURRENT_TOKEN,
    NOW_MS_LUA,
    WAITER_MARGIN_MS,
    drop_lost_grant,
    new_grant,
    next_token,
    publish_to_waiter,
    release_one,
    report_or_reenter,
    store_holder,
)
from django_rlock.core._protocol.names import LockKeys, milliseconds
from django_rlock.core._protocol.plan import AcquirePlan

#: How long a queue entry outlives the sleep its waiter announced, in ms: the
#: waiter's own delay between waking and its next attempt (as scripts.ACQUIRE's).
ENTRY_MARGIN_MS = WAITER_MARGIN_MS


class FairKeys(LockKeys):
    """A fair lock's keys: a lock's, under ``:fair``, and its arrival queue."""

    __slots__ = ()

    @property
    def queue(self) -> str:
        """The arrival queue: queue id -> arrival number."""
        return f"{self.hash}:queue"

    @property
    def entries(self) -> str:
        """What a handoff needs per queue id: owner id, holder metadata, last request id."""
        return f"{self.hash}:entries"


def fair_keys(prefix: str, name: str) -> FairKeys:
    """The keys of the fair lock ``name`` under ``prefix`` (both already checked)."""
    return FairKeys.around(name, LockKeys.build(prefix, name).hash + ":fair")


# Expects KEYS[3] the entries' expiries, KEYS[$queue] the queue,
# KEYS[$entries] the handoff entries, and `now`.
# Drops the expired entries, then finds `head`, the first live entry (nil: none).
# An entry missing from the expiries (never written so, but a queue must not
# stall on it) is dropped too. O(dropped * log N).
_PRUNE = """
local expired = redis.call('zrange', KEYS[3], '-inf', now, 'byscore')
for i = 1, #expired do
    redis.call('zrem', KEYS[$queue], expired[i])
    redis.call('hdel', KEYS[$entries], expired[i])
end
if #expired > 0 then
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
end
local head = redis.call('zrange', KEYS[$queue], 0, 0)[1]
while head and not redis.call('zscore', KEYS[3], head) do
    redis.call('zrem', KEYS[$queue], head)
    redis.call('hdel', KEYS[$entries], head)
    head = redis.call('zrange', KEYS[$queue], 0, 0)[1]
end
"""


def _fill(script: str, *, queue: int, entries: int, fence: int = 2) -> str:
    """``script``'s fields filled: the indexes of its keys, given by name, and the margin.

    A field the script names and this leaves unfilled raises ``KeyError``.
    """
    return Template(script).substitute(
        queue=queue, entries=entries, fence=fence, margin_ms=ENTRY_MARGIN_MS
    )


# Expects the lock free (its hash gone) and
# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] entry expiries,
# KEYS[$queue] queue, KEYS[$fence] fencing counter, KEYS[$entries] handoff entries,
# ARGV[2] publish command.
# Finds the live head (_PRUNE, defining `now` and `head`) and hands the lock
# to it: a new grant to the owner its entry names, exactly as FAIR_ACQUIRE's
# (token, holder metadata), living the head's own watchdog timeout (its entry
# says), marked '~handoff' = its queue id, the head out of the queue. The
# message names the head, the token and the request id of the head's last
# attempt. A head with no entry (never written so) is only woken, by name.
_HAND_ON = (
    NOW_MS_LUA
    + _PRUNE
    + """
if head then
    local entry = redis.call('hget', KEYS[$entries], head)
    if entry then
        local first = string.find(entry, '\\n', 1, true)
        local second = string.find(entry, '\\n', first + 1, true)
        local third = string.find(entry, '\\n', second + 1, true)
        local owner = string.sub(entry, 1, first - 1)
        local life = tonumber(string.sub(entry, first + 1, second - 1))
        local rid = string.sub(entry, second + 1, third - 1)
        local holder = string.sub(entry, third + 1)
"""
    + next_token(counter="KEYS[$fence]")
    + """
        if holder ~= '' then
"""
    + store_holder(
        key="KEYS[1]",
        fields="owner, 1, '~since', string.format('%.0f', now), '~handoff', head",
        description="holder",
        indent="            ",
    )
    + """\
        else
            redis.call('hset', KEYS[1], owner, 1, '~handoff', head)
        end
        redis.call('pexpire', KEYS[1], life)
        redis.call('set', KEYS[$fence], string.format('%.0f', token), 'px', life)
        redis.call('zrem', KEYS[$queue], head)
        redis.call('zrem', KEYS[3], head)
        redis.call('hdel', KEYS[$entries], head)
"""
    + publish_to_waiter(
        waiter="head",
        channel="KEYS[2]",
        message="head .. ' ' .. string.format('%.0f', token) .. ' ' .. rid",
        indent=" " * 8,
    )
    + """    else
"""
    + publish_to_waiter(waiter="head", channel="KEYS[2]", indent=" " * 8)
    + """    end
end
"""
)


# FAIR_ACQUIRE's way out of line on a new grant (expects `head`, ARGV[3] queue
# id): a queued caller (there is a head: it is the caller) leaves the queue,
# its entry's expiry and its handoff entry.
_LEAVE_QUEUE = """
if head then
    redis.call('zrem', KEYS[$queue], ARGV[3])
    redis.call('zrem', KEYS[3], ARGV[3])
    redis.call('hdel', KEYS[$entries], ARGV[3])
end
"""


# KEYS[1] lock hash, KEYS[2] fencing counter, KEYS[3] entry expiries,
# KEYS[4] the owner's request latch, KEYS[5] arrival queue, KEYS[6] handoff entries
# ARGV: as scripts.ACQUIRE's, except ARGV[3], the caller's queue id ('' for an
#   attempt that will not wait: it never enters the queue), and ARGV[4], the
#   longest the caller will sleep before its next attempt, in ms; ARGV[9] the
#   caller's watchdog timeout in ms (the life of a grant handed to it).
# Returns as scripts.ACQUIRE: {token, holds, pttl} when granted (a re-entry and
#   a resent call's report work exactly as there; a re-entry ignores the queue:
#   its owner holds the lock already), else the ms to wait at most.
#   A lock handed to the caller (the hash's '~handoff' is its queue id) is
#   confirmed: the expiry becomes the caller's own and the reply is a *new*
#   grant {token, 1, pttl}, as the caller has not counted it (its message was
#   lost, stale, or it waits with a fixed lease). Any other call of the owner
#   finds the marker done and clears it.
#   A new grant needs the lock free and the caller the queue's live head (or
#   the queue empty); it takes the caller out of the queue. Otherwise a caller
#   with a queue id is queued at the tail if it is not queued yet (its place is
#   kept on later attempts), its entry lives until its sleep ends + the margin
#   and records, in KEYS[6], what a handoff needs: owner id, watchdog timeout,
#   this attempt's request id (the message names it), holder metadata; the wait
#   is the holder's PTTL, or, when the lock is free but another caller heads
#   the queue, what is left of the head's entry: when it expires, the next
#   caller's retry finds itself at the head. The wait is capped by ARGV[4], so
#   the entry always outlives the sleep that follows.
FAIR_ACQUIRE = _fill(
    """
local ttl = tonumber(ARGV[2])
"""
    + drop_lost_grant("~handoff")
    + report_or_reenter(latch="4", token=CURRENT_TOKEN, fence="KEYS[2]", handoff=CONFIRM_HANDOFF)
    + NOW_MS_LUA
    + _PRUNE
    + """
local free = redis.call('exists', KEYS[1]) == 0
if free and (not head or head == ARGV[3]) then
"""
    + new_grant(latch="4", leave=_LEAVE_QUEUE)
    + """
end
local wait
if free then
    wait = tonumber(redis.call('zscore', KEYS[3], head)) - now
else
    wait = redis.call('pttl', KEYS[1])
end
if ARGV[3] ~= '' then
    local cap = tonumber(ARGV[4])
    if wait < 0 or wait > cap then
        wait = cap
    end
    if wait < 1 then
        wait = 1
    end
    local life = wait + $margin_ms
    redis.call('zadd', KEYS[3], now + life, ARGV[3])
    if not redis.call('zscore', KEYS[$queue], ARGV[3]) then
        local last = redis.call('zrange', KEYS[$queue], -1, -1, 'withscores')
        redis.call('zadd', KEYS[$queue], (tonumber(last[2]) or 0) + 1, ARGV[3])
    end
    redis.call('hset', KEYS[$entries], ARGV[3],
               ARGV[1] .. '\\n' .. ARGV[9] .. '\\n' .. ARGV[5] .. '\\n' .. ARGV[8])
    for _, key in ipairs({KEYS[3], KEYS[$queue], KEYS[$entries]}) do
        if redis.call('pttl', key) < life then
            redis.call('pexpire', key, life)
        end
    end
end
return wait
""",
    queue=5,
    entries=6,
)


# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] entry expiries,
# KEYS[4] the owner's request latch, KEYS[5] arrival queue,
# KEYS[6] fencing counter, KEYS[7] handoff entries
# ARGV[1] owner id, ARGV[2] publish command, ARGV[3] this call's request id
# Returns as scripts.RELEASE: -1 when the owner holds nothing (nothing is
#   changed), else the owner's holds left; a resent call reports as there.
#   At 0 the lock is free, and is handed to the queue's live head, if any
#   (_HAND_ON). A head that has not subscribed yet misses the message, and
#   finds the grant with the attempt it makes once its subscription is
#   confirmed (core/plan.py).
FAIR_RELEASE = _fill(
    release_one(latch="4")
    + """
if redis.call('exists', KEYS[$queue]) == 0 then
    return 0
end
"""
    + _HAND_ON
    + """
return 0
""",
    queue=5,
    entries=7,
    fence=6,
)


# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] entry expiries, KEYS[4] arrival queue,
# KEYS[5] fencing counter, KEYS[6] handoff entries
# ARGV[1] queue id, ARGV[2] publish command
# A waiter leaves the queue without the lock (its wait ran out, or it was
#   cancelled). If the lock was handed to it (the hash's '~handoff' is its
#   queue id), that grant is given back: nobody counts it. If it was queued or
#   handed the lock, and the lock is free, the lock is handed on to the next
#   live head, so it is not left waiting out its own sleep.
# Returns 1 when the lock was handed on (or a head woken), else 0.
FAIR_ABANDON = _fill(
    """
redis.call('zrem', KEYS[3], ARGV[1])
redis.call('hdel', KEYS[6], ARGV[1])
local queued = redis.call('zrem', KEYS[4], ARGV[1]) == 1
if redis.call('hget', KEYS[1], '~handoff') == ARGV[1] then
    redis.call('del', KEYS[1])
elseif not queued or redis.call('exists', KEYS[1]) == 1 then
    return 0
end
"""
    + _HAND_ON
    + """
if head then
    return 1
end
return 0
""",
    queue=4,
    entries=6,
    fence=5,
)


def fair_acquire_call(call: ScriptCall, keys: FairKeys, watchdog_timeout: float) -> ScriptCall:
    """A plain lock's acquire call (:mod:`~.calls`) as FAIR_ACQUIRE takes it.

    FAIR_ACQUIRE takes the ARGV of scripts.ACQUIRE, plus the caller's watchdog
    timeout (the life of a grant handed to it); its KEYS are the hash, its
    fencing counter, the waiting set and the owner's request latch (the fair
    lock keeps them apart, where the plain lock keeps counter and latch in its
    hash), then the queue and the handoff entries: one builder for both kinds.
    """
    owner = str(call.args[0])
    return ScriptCall(
        keys=[*counter_acquire_keys(keys, owner), keys.queue, keys.entries],
        args=[*call.args, milliseconds(watchdog_timeout)],
        rid=call.rid,
    )


def fair_release_call(call: ScriptCall, keys: FairKeys) -> ScriptCall:
    """A plain lock's release call on ``keys``, as FAIR_RELEASE takes it.

    The owner's own request latch (where the plain lock has the name's
    latches hash), plus the queue, the fencing counter and the entries: a
    release that frees the lock hands it on.
    """
    owner = str(call.args[0])
    return ScriptCall(
        keys=[*counter_release_keys(keys, owner), keys.queue, keys.fence, keys.entries],
        args=call.args,
        rid=call.rid,
    )


def fair_abandon_call(keys: FairKeys, queue_id: str, publish: str) -> ScriptCall:
    """A waiter leaves the queue without the lock (FAIR_ABANDON)."""
    call = abandon_call(keys, queue_id, publish)
    return ScriptCall(keys=[*call.keys, keys.queue, keys.fence, keys.entries], args=call.args)


class FairScripts(ScriptSet):
    """The fair lock's scripts: acquire is plain, release and abandon run under OOM.

    See :class:`~django_rlock.core._protocol.lock.ScriptSet`.
    """

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the fair lock's scripts."""
        self.acquire = plain(FAIR_ACQUIRE)
        self.release = oom_safe(FAIR_RELEASE)
        self.abandon = oom_safe(FAIR_ABANDON)


#: The shortest sleep a queued waiter announces, in seconds (its deadline is near).
_MIN_SLEEP = 0.001


def sleep_cap(plan: AcquirePlan) -> float:
    """The longest a queued waiter of ``plan`` sleeps before its next attempt, in seconds.

    The fair script makes the waiter's entry outlive this sleep, so it must be
    short enough that a waiter that dies stalls the queue for no longer than
    the watchdog timeout, and no longer than the caller's own wait.
    """
    remaining = plan.deadline - clock.monotonic()
    return max(min(plan.watchdog_timeout, remaining), _MIN_SLEEP)


class FairBase(LockBase):
    """What :class:`FairLock` and the asyncio ``AsyncFairLock`` share: keys and script calls.

    Put before the RLock class it extends (``class FairLock(FairBase, RLock)``),
    it turns the plain calls into the fair scripts' (see :func:`with_queue`).
    """

    kind = "fair_lock"  # its factory, named when a client's layout refuses it

    #: The fair lock's keys (also :attr:`keys`), with its queue.
    fair_keys: FairKeys

    def _fair_setup(self) -> None:
        """Point the lock at the fair keys; refuse what a fair lock cannot do."""
        engine = self._engine
        if engine.min_replicas:
            raise ValueError(
                f"fair_lock({self.name!r}) does not support min_replicas "
                f"(the client has min_replicas={engine.min_replicas}): a fair grant "
                "undone for want of replicas would have to give the head its turn back; "
                "use a client with min_replicas=0 for fair locks"
            )
        self.fair_keys = fair_keys(engine.key_prefix, self.name)
        self.keys = self.fair_keys
        #: Queue id -> request id of that waiter's last attempt, which a
        #: handoff message names (one entry per waiting acquire call).
        self._last_requests: dict[str, str] = {}

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        """The plain acquire call on the fair keys, plus the queue (``waiter_id``: queue id)."""
        call = fair_acquire_call(
            super()._acquire_call(owner, lease, waiter_id, sleep),
            self.fair_keys,
            self._engine.watchdog_timeout,
        )
        if waiter_id:
            self._last_requests[waiter_id] = call.rid
        return call

    def _release_call(self, owner: str) -> ScriptCall:
        """The plain release call on the fair keys, plus what a handoff needs."""
        return fair_release_call(super()._release_call(owner), self.fair_keys)

    def _abandon_call(self, queue_id: str) -> ScriptCall:
        return fair_abandon_call(self.fair_keys, queue_id, self._engine.publish_command)

    @staticmethod
    def _fair_row(fair: Any, plain: Any) -> KindScripts:
        """The fair scripts' row (see :class:`KindScripts`) from the fair and plain script sets.

        FAIR_ABANDON leaves the queue, waking the next head if the lock is
        free. Force-release is the plain lock's: deleting the hash frees the
        lock, and its message wakes the queue's head, which keeps its turn.
        """
        return KindScripts(fair.acquire, fair.release, fair.abandon, plain.force_release)

    def _take_handoff(
        self,
        waiting: _FairShell,
        subscription: CarriesHandoff,
    ) -> bool:
        """Record the grant a handoff message brought ``waiting``'s caller; False: none taken.

        Taken only when the message names the caller's last attempt (so the
        grant came after that attempt was sent, and its send time bounds the
        deadline from below), the caller waits with the watchdog, and that
        deadline leaves the watchdog time to renew. Otherwise the caller's
        next attempt confirms the grant (FAIR_ACQUIRE), or finds it gone.
        """
        grant, subscription.handoff = subscription.handoff, b""
        if not grant or waiting.lease is not None:
            return False
        token, _, rid = grant.partition(b" ")
        last = self._last_requests.get(waiting.queue_id)
        # Anything else on the channel (a stale or foreign message) is only a wake-up.
        if last is None or rid != last.encode() or not token.isdigit():
            return False
        watchdog = self._engine.watchdog_timeout
        if waiting.sent_at + watchdog - clock.monotonic() <= handoff_min_life(watchdog):
            return False
        self._registry.grant(
            self,
            waiting.owner,
            token=int(token),
            holds=1,
            lease=None,
            sent_at=waiting.sent_at,
            pttl_ms=milliseconds(watchdog),
            requested_at=waiting.plan.started,
        )
        waiting.queued = False  # the handoff took the caller out of the queue
        return True

    def _end_waiting(self, queue_id: str) -> None:
        self._last_requests.pop(queue_id, None)

    def _queue_id(self, plan: AcquirePlan, new_waiter_id: Callable[[], str]) -> str:
        """The caller's place in the queue for one acquire call ('' when it will not wait).

        The plan's first attempt is sent before the caller subscribes, yet it
        is the one that must take the caller's place (arrival order is the
        order of first busy attempts). So the id is a waiter id taken from the
        listener before that attempt, and the subscription is then made under
        the same id: a release that names the head wakes that very waiter.
        An id per acquire call (not the owner id) also keeps owner ids, the
        holders' credentials, off the release channel.
        """
        return new_waiter_id() if plan.blocking and not plan.zero_wait else ""


class _FairShell(Protocol):
    """What :meth:`FairBase._take_handoff` reads of a waiting shell (sync or asyncio)."""

    owner: str
    lease: float | None
    plan: AcquirePlan
    queue_id: str
    queued: bool
    sent_at: float
