"""The plain lock's protocol: its Lua scripts, script sets, options and what a kind needs.

The scripts (ACQUIRE, RELEASE, RENEW, FORCE_RELEASE, ABANDON; rendered whole
in ``docs/lua/lock.*.lua``), the script registry, :class:`LockOptions` and
:class:`LockEngine`; the bookkeeping around an acquire, a release and a loss,
which never does I/O, is ``LockBase`` (:mod:`~django_rlock.core._protocol.lockbase`).
The threaded and asyncio shells (``_sync/locks.py``, ``_aio/locks.py``) send
what they build.

The Lua scripts: one atomic, O(1) script per lock operation.

They are composed from the pieces every lock kind shares
(:mod:`~django_rlock.core._protocol.lua`: the clock, the fencing rule, the request
latch, grants, waiter registration, release and wake-up); the sibling kinds'
scripts (fair lock, read-write lock, semaphore) are made of the same pieces.
Each piece is a function whose keyword arguments name the keys and values it
works on (``new_grant(latch="4")``, ``register_waiter(waiters="KEYS[3]")``), and
a script is those pieces and its own Lua, joined in order; the plain lock's own
Lua names no field, so no script here is a template of its own.

Each script is run with EVALSHA through redis-py's ``Script``, which reloads it
when the server answers NOSCRIPT (after a restart or ``SCRIPT FLUSH``), so a
flushed script cache costs one extra round trip and nothing else.

Lost replies. redis-py resends a command when the connection breaks before
the reply arrives, but the server may already have run it. Acquire and release
are therefore made idempotent by a *request latch*: the caller sends a request
id, unique per call, and the script records it where a resend will look. While
the owner holds the lock, that is a field of the lock's hash (``~r``), written
by the same HSET that counts the hold and read with the hold count by one
HMGET; a final release, which deletes the hash, writes it under the owner in
the name's latches hash (``<lock>:req``, same hash slot,
:data:`REQUEST_LATCH_MS` to live). A resent call finds its id already there
and reports the current state instead of applying itself twice, at no extra
round trip; the callers that never resend (RedLock's bounded connections,
replica undo) send no request id. The sibling kinds keep a latch key per owner
(``<hash>:req:<owner>``, written with ``SET ... GET``).

Out of memory. With ``maxmemory`` reached and ``noeviction``, Redis refuses
commands that may grow memory. Acquire must be refused then (it creates keys),
but giving a lock back must not be, or a full server would keep every lock
held. On Redis >= 7 release, renew, abandon and force-release carry the
``allow-oom`` flag (:class:`OomSafeScript`); a server that cannot compile a
flagged script (Redis < 7) gets the plain variant, chosen once per script and
client on its first load, on the connection that is running it (no version
query, so no extra ACL permission and no I/O when a client is built). On Redis
< 7 a release under OOM is refused as well: a documented limit.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from string import Template
from typing import (
    TYPE_CHECKING,
    Any,
    NamedTuple,
    Protocol,
    TypedDict,
    TypeVar,
)

import redis.exceptions as redis_errors

from django_rlock.core._protocol.lua import (
    REQUEST_LATCH_MS,
    STARVING_AFTER_MS,
    next_token,
    register_waiter,
    release_and_hand_over,
    store_holder,
)
from django_rlock.core.defaults import renewal_interval, renewal_socket_timeout

if TYPE_CHECKING:
    from django_rlock.core._protocol.holds import HoldRegistry


#: Seconds a plain lock's waiter waits before it is *starving*: the holder's
#: release then hands it the lock (scripts.ACQUIRE, RELEASE), as Go's
#: sync.Mutex hands off to a waiter after 1 ms; so does a waiter that was
#: woken and lost the race. A hand-over makes the next owner a woken process,
#: never the releasing one that would take the lock again at once, so it is
#: kept for waiters that need it. The server counts it from the waiter's
#: first registration under the current holder; the waiter, from its call.
STARVING_AFTER = STARVING_AFTER_MS / 1000


#: Every command the scripts run. An ACL user needs them all (scripts' own
#: commands are checked too), besides EVALSHA, SCRIPT LOAD and the commands the
#: client sends itself (docs/acl-and-tls.md: "Minimal ACL").
SCRIPT_COMMANDS = (
    "exists", "hexists", "hget", "hset", "hincrby", "pttl", "pexpire", "get", "set", "del",
    "zadd", "zrem", "zrange", "zremrangebyscore", "zcard", "publish", "time",
    "sadd", "srem", "smembers", "zscore", "hdel", "hgetall", "hmget", "pubsub|numsub",
)  # fmt: skip


#: The first line of the scripts that must run even when Redis is out of memory.
ALLOW_OOM = "#!lua flags=allow-oom\n"


# The lock's hash keeps, beside its owner's field (owner id -> hold count),
# what the lock needs while it is held, so that a held lock is one key:
#   '~t'       the grant's fencing token (TOKEN_FIELD)
#   '~r'       the holder's last request id (LATCH_FIELD): the request latch of
#              every call that leaves the owner holding (a grant, a re-entry, a
#              release that leaves holds), read with the owner's field by one
#              HMGET
#   '~holder', '~task', '~since'  who holds it, for operators (core/holder.py)
# (owner ids never start with '~'). They are renewed, expire and are deleted
# with the lock. What a final release must leave behind goes to one hash per
# name, ``<lock>:req`` (names.LockKeys.latches), for REQUEST_LATCH_MS: the
# releasing owner -> its request id (a resend of that release, which finds
# the lock hash gone or another owner's, must still be told it was applied),
# and '~t', the released token (the next grant's token is above it even if
# the server's clock stepped back meanwhile). Nothing else outlives a lock.

#: The lock hash's field holding the current grant's fencing token (also the
#: last released token, in the name's latches hash).
TOKEN_FIELD = "~t"

#: The lock hash's field holding the holder's last request id (its request latch).
LATCH_FIELD = "~r"


# KEYS[1] lock hash, KEYS[2] waiting set, KEYS[3] the name's latches (last token)
# ARGV[1] owner id, ARGV[2] expiry in milliseconds,
# ARGV[3] waiter id ('' for an attempt that will not wait),
# ARGV[4] the longest the waiter will sleep before trying again, in milliseconds,
#   negated by a waiter that says it starves (woken and lost, or waited past
#   STARVING_AFTER),
# ARGV[5] this call's request id ('' for a caller that never resends),
# ARGV[6] the owner's holds of this lock that its client has declared lost, or
#   given up while the server may still count them (core/lostholds.py; 0: none;
#   only whether there are any matters), ARGV[7] the token of those holds,
# ARGV[8] who asks, for operators (core/holder.py, never the owner id; '' for
#   none): a new grant stores it in the hash as '~holder' and '~task'
#   (lua.store_holder: each at most 64 bytes, so the hash stays a listpack),
#   with the server's clock in ms as '~since', so it is renewed, expires and
#   is deleted with the lock, at no round trip
# Returns {token, holds, pttl} when granted, pttl being the key's life left in
#   ms after the call: the caller's deadline is its send time + pttl, whatever
#   the branch (one PTTL, read first, tells a free lock, -2, from a held one
#   and is the life reported). A new grant's token is max(last token + 1, the server's clock
#   in microseconds), the last token being the one a final release left in
#   KEYS[3] (a new grant finds no hash, so no live grant's token): tokens
#   keep increasing when Redis loses every key (a restart without
#   persistence, FLUSHALL, a failover), and when the clock steps back within
#   a minute of a release. The token lives in the hash ('~t') while the lock
#   is held. A re-entry keeps the token, adds one hold, and never shortens
#   the key's life (a short lease inside a watchdog hold must not expire the
#   outer hold). A granted waiter leaves the waiting set.
#   A resent call that was already granted (the hash's '~r' holds its request
#   id) changes nothing and returns the same {token, holds} with the PTTL left
#   now: the grant happened at the first call, not at the resend. Only the
#   re-entry branch can see such a resend: a first grant makes the owner a
#   holder, and only the holder writes '~r'.
#   Holds the client has declared lost (ARGV[6]) may still be on the server (a
#   loss declared on the local deadline while the key lived on): while the
#   token is still theirs, the hash is the lost grant's (the lock is
#   exclusive) and goes first, with every hold of the owner (also re-entries
#   the server applied but whose replies were lost), before the latch is
#   read, so the call is a new grant with a new token, never a re-entry of a
#   hold its owner was told is gone, nor a report of one.
#   A lock handed to the caller by a release (the hash's '~handoff' is its
#   waiter id, RELEASE) whose message it did not take is confirmed: a new
#   grant {token, 1, ttl} with the caller's own expiry; any other call of the
#   owner finds the marker done and clears it.
# Returns the holder's PTTL in ms (an integer; -1 when the key has no expiry)
#   when another owner holds the lock; a waiter is then (re-)entered in the
#   waiting set until just after its sleep ends, so a release can wake it,
#   and writes what a grant to it needs in the holder's hash ('~w:<waiter
#   id>': owner, life, since when it waits, description), which goes with
#   that hash: the release hands the lock to it if it starves by then.
ACQUIRE = (
    Template("""
local ttl = tonumber(ARGV[2])
if tonumber(ARGV[6] or '0') ~= 0 and redis.call('hget', KEYS[1], '$token') == ARGV[7] then
    redis.call('del', KEYS[1])
end
local rid = ARGV[5] or ''
local pttl = redis.call('pttl', KEYS[1])
if pttl ~= -2 then
    local mine = redis.call('hmget', KEYS[1], ARGV[1], '$latch', '$token', '~handoff')
    if mine[1] then
        local token = tonumber(mine[3] or '0')
        if rid ~= '' and mine[2] == rid then
            return {token, tonumber(mine[1]), pttl}
        end
        if mine[4] then
            redis.call('hdel', KEYS[1], '~handoff')
            if mine[4] == ARGV[3] then
                redis.call('hset', KEYS[1], '$latch', rid)
                redis.call('pexpire', KEYS[1], ttl)
                return {token, 1, ttl}
            end
        end
        local holds = tonumber(mine[1]) + 1
        redis.call('hset', KEYS[1], ARGV[1], holds, '$latch', rid)
        if pttl < ttl then
            redis.call('pexpire', KEYS[1], ttl)
            pttl = ttl
        end
        return {token, holds, pttl}
    end
else
""").substitute(token=TOKEN_FIELD, latch=LATCH_FIELD)
    + next_token(counter="KEYS[3]", field=TOKEN_FIELD)
    + Template(
        """local fence = string.format('%.0f', token)
if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
        + store_holder(
            key="KEYS[1]",
            fields="ARGV[1], 1, '$token', fence, '$latch', rid, "
            "'~since', string.format('%.0f', since)",
            description="ARGV[8]",
            indent="    ",
        )
        + """else
    redis.call('hset', KEYS[1], ARGV[1], 1, '$token', fence, '$latch', rid)
end
redis.call('pexpire', KEYS[1], ttl)
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[2], ARGV[3])
end
return {token, 1, ttl}
end
"""
    ).substitute(token=TOKEN_FIELD, latch=LATCH_FIELD)
    + register_waiter(waiters="KEYS[2]", hand_over=True)
)


# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] waiting set,
# KEYS[4] (optional) the name's latches (names.LockKeys.latches)
# ARGV[1] owner id, ARGV[2] publish command ('publish', or 'spublish' on a cluster),
# ARGV[3] (with KEYS[4]) this call's request id
# Returns -1 when the owner holds nothing (nothing is changed), else the
#   owner's holds left. At 0 the lock is free, and when a registered waiter is
#   left (expired registrations are dropped) the release is published naming
#   the one to wake: the waiter whose sleep ends first, on the wake channel its
#   entry names (KEYS[2] .. ':' .. its wake name, core/_protocol/channels.py),
#   so one process reads it; an entry of an older version (no wake name) on
#   the shared channel KEYS[2]. With no waiter left, nothing is published (a
#   PUBLISH costs the server a channel lookup, and the client a bigger script,
#   on every uncontended release).
#   A resent call that was already applied changes nothing and returns the
#   owner's holds now (0 after a final release, even if another owner has
#   taken the lock since). A release that leaves holds keeps its request id
#   in the hash ('~r', as ACQUIRE does); a final release, which deletes the
#   hash, writes its id under the owner in KEYS[4], with the released token
#   as '~t', and gives KEYS[4] REQUEST_LATCH_MS to live: the one thing a lock
# cycle leaves behind.
#   Hand-over (lua._HAND_OVER): when that first waiter starves (its
#   '~w:<id>' request in the hash being released says so, or is
#   STARVING_AFTER old) and has a wake name, the release grants it the lock
#   (the next token after the released one, its life and description, marked
#   '~handoff' = its id) and tells it "<id> <token>" on its wake channel; the
#   grant is made only if this server has a subscriber on that channel
#   (asked before publishing), else the waiter is woken and the next one too.
#   A release that hands over wakes the new holder, not a retry: the argument
#   below holds for the waiters left, as the new holder's release comes later.
#
# Why publishing only to a registered waiter wakes everyone who needs it. A
#   message helps only a waiter *sleeping* on the channel (plan.AcquirePlan:
#   the "wait" step). A waiter sleeps only after an attempt as a registered
#   waiter that found the lock held: that attempt, in ACQUIRE, entered it in
#   the waiting set in the same atomic script that saw the holder, with a
#   score (server time + its sleep + 500 ms) past the end of the sleep it is
#   about to take. So for any release, either it ran before that attempt (the
#   attempt sees the lock free, or held by a newer holder whose own release
#   comes later), or after it: then the waiter's entry is in the set and this
#   script names a registered waiter. The first, unregistered attempt never
#   sleeps on the channel: the waiter subscribes, has the subscription
#   confirmed, and attempts again as a registered waiter before it sleeps, so
#   a release between its two attempts is seen by the second one.
#   The message reaches the named waiter: its subscription is to both the
#   shared channel and the wake channel of its id's wake name (one SUBSCRIBE,
#   both confirmed before that registered attempt; core/_sync/waiting.py),
#   and the message goes to exactly one of them: the wake channel for an id
#   with a wake name, the shared channel otherwise (an older version's waiter,
#   which listens there; an older version's release names any waiter there,
#   and new waiters listen there too). The waiter's listener routes it by the
#   id, whichever channel it came on.
#   Every caller of this script (release, the replica-sync undo in client.py,
#   MultiLock's members, RedLock's undo of an unanswered grant) releases a
#   plain lock hash, and every sleeper of those locks is an RLock acquire plan
#   (MultiLock waits through its members' plans; RedLock never sleeps on a
#   channel, it retries after a random pause). On a cluster, the set, the hash
#   and the channel share one slot, so this check and SPUBLISH run on the node
#   the waiter's SSUBSCRIBE is on; the wake channel is made from KEYS[2], after
#   its hash tag, so it is in that slot too.
#   The one waiter this misses is one whose entry expired while it still
#   sleeps: its client paused for more than 500 ms, or the server's clock
#   jumped forward. Before, a release with no live entry woke everyone; that
#   waiter now sleeps out its own bound (the holder's PTTL, at most the
#   watchdog timeout), exactly as a lost message costs it, and as it already
#   did whenever another live waiter was named instead. force_release still
#   wakes every waiter (an operator's recovery tool, not a hot path), and
#   ABANDON hands a wake-up on only while the set has members.
RELEASE = Template("""
local mine = redis.call('hmget', KEYS[1], ARGV[1], '$latch', '$token')
if not mine[1] then
    if KEYS[4] and redis.call('hget', KEYS[4], ARGV[1]) == ARGV[3] then
        return 0
    end
    return -1
end
local rid = ARGV[3] or ''
if rid ~= '' and mine[2] == rid then
    return tonumber(mine[1])
end
local holds = tonumber(mine[1]) - 1
if holds > 0 then
    redis.call('hset', KEYS[1], ARGV[1], holds, '$latch', rid)
    return holds
end
if KEYS[4] then
    redis.call('hset', KEYS[4], ARGV[1], rid, '$token', mine[3] or '0')
    redis.call('pexpire', KEYS[4], $latch_ms)
end
""").substitute(
    latch=LATCH_FIELD, token=TOKEN_FIELD, latch_ms=REQUEST_LATCH_MS
) + release_and_hand_over(last="mine[3]", token_field=TOKEN_FIELD)


# KEYS[2i-1] the i-th lock hash, KEYS[2i] the key that expires with it (a
#   sibling kind's fencing counter; the lock hash again for the plain lock,
#   whose token is in its hash: not expired twice)
# ARGV[1] expiry in milliseconds,
# ARGV[2] '1' to set that expiry even if shorter (MultiLock's re-expiry of a
#   grant it has just made), '0' to never shorten a key's life (the watchdog:
#   a watchdog re-entry inside a longer lease must not cut the lease short),
# ARGV[2+i] owner id of the i-th lock
# Returns one integer per lock: the key's PTTL in ms after the call (> 0:
#   renewed; the caller's deadline is its send time + it), or 0 when the owner
#   no longer holds it (lost). The key beside it gets the same expiry.
RENEW = """
local ttl = tonumber(ARGV[1])
local exact = ARGV[2] == '1'
local left = {}
for i = 1, #KEYS / 2 do
    local key, fence = KEYS[2 * i - 1], KEYS[2 * i]
    if redis.call('hexists', key, ARGV[i + 2]) == 1 then
        local pttl = redis.call('pttl', key)
        if exact or pttl < ttl then
            redis.call('pexpire', key, ttl)
            if fence ~= key then
                redis.call('pexpire', fence, ttl)
            end
            pttl = ttl
        end
        left[i] = pttl
    else
        left[i] = 0
    end
end
return left
"""


# KEYS[1] lock hash, KEYS[2] release channel
# ARGV[1] publish command
# Returns 1 when a held lock was deleted (every waiter is woken), 0 when it was free.
FORCE_RELEASE = """
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[1], KEYS[2], '')
    return 1
end
return 0
"""


# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] waiting set
# ARGV[1] waiter id, ARGV[2] publish command
# A waiter leaves without the lock (its wait ran out). If the lock was handed
#   to it (the hash's '~handoff' is its id: RELEASE), that grant is given
#   back: its caller never counted it; else its request to be handed the lock
#   (the holder's '~w:<id>' field, ACQUIRE) goes. If the lock is free, a
#   release may have woken this waiter alone: wake the others instead.
# Returns 1 when the others were woken, else 0.
ABANDON = """
redis.call('zrem', KEYS[3], ARGV[1])
if redis.call('hget', KEYS[1], '~handoff') == ARGV[1] then
    redis.call('del', KEYS[1])
else
    redis.call('hdel', KEYS[1], '~w:' .. ARGV[1])
end
if redis.call('exists', KEYS[1]) == 0 and redis.call('zcard', KEYS[3]) > 0 then
    redis.call(ARGV[2], KEYS[2], '')
    return 1
end
return 0
"""


#: How a client makes one script of a body: a redis-py ``Script`` on its connection
#: (:mod:`~django_rlock.core._sync.scripts`) or its asyncio twin.
MakeScript = Callable[[str], Any]


class ScriptSet:
    """One kind's scripts, made for one Redis client (sync or asyncio).

    A subclass's :meth:`register` makes each script with ``plain`` when it may
    create keys (under OOM its first write is refused, so it fails whole, with
    Redis's OOM error, before changing anything) or with ``oom_safe`` when it
    gives back or only deletes (it runs under OOM where Redis allows it).
    A client makes each kind's set once, on first use (:class:`ScriptRegistry`).
    """

    def __init__(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        self.register(plain, oom_safe)

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make this kind's scripts as attributes."""
        raise NotImplementedError


KindSet = TypeVar("KindSet", bound=ScriptSet)


class ScriptRegistry:
    """One client's scripts, by kind: ``registry[FairScripts]`` is the fair lock's set.

    Each kind's set is made on its first use, with the client's two script
    factories (sync or asyncio, see :class:`ScriptSet`), so a client that never
    takes a fair lock never makes its scripts, and adding a kind touches no
    client. Making a set twice under a race is harmless: the first one kept
    wins, and a script is loaded on the server only when first run.
    """

    def __init__(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        self._plain = plain
        self._oom_safe = oom_safe
        self._sets: dict[type[ScriptSet], ScriptSet] = {}

    def __getitem__(self, kind: type[KindSet]) -> KindSet:
        made = self._sets.get(kind)
        if made is None:
            made = self._sets.setdefault(kind, kind(self._plain, self._oom_safe))
        return made  # type: ignore[return-value]  # keyed by its own class


class LockScripts(ScriptSet):
    """The plain lock's scripts; acquire stays plain (see :class:`ScriptSet`)."""

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the lock's scripts."""
        self.acquire = plain(ACQUIRE)
        self.release = oom_safe(RELEASE)
        self.renew = oom_safe(RENEW)
        self.force_release = oom_safe(FORCE_RELEASE)
        self.abandon = oom_safe(ABANDON)


logger = logging.getLogger("django_rlock.lock")


T = TypeVar("T")


_requests = itertools.count(1)


def request_id() -> str:
    """A new id for one acquire or release call, unique within this process.

    Latches are per owner, and owner ids are unique across processes, so a
    process-wide counter is enough (see :mod:`django_rlock.core._protocol.lock`).
    """
    return str(next(_requests))


#: A connection that broke under a call: its reply is lost, and whether Redis
#: ran the call is unknown. A *timeout* is not resent: a resend would double
#: how long a call may hang on a partitioned or stalled server.
LOST_REPLY = (redis_errors.ConnectionError,)


#: Errors after which a call may or may not have run on the server.
UNANSWERED = (redis_errors.ConnectionError, redis_errors.TimeoutError)


def resend_once(call: Callable[[], T]) -> T:
    """Run ``call``; when its connection broke before the reply, send it once more.

    ``call`` must carry one request id for both sends: the script's request
    latch turns a resend of a call Redis already ran into a report of the
    current state, so a lost reply neither double-counts a hold nor leaves one
    that nobody renews.
    """
    try:
        return call()
    except LOST_REPLY:
        return call()


def gave_up_after(blocking: bool, timeout: float | None) -> str:
    """How long a ``with`` block that timed out tried, for its LockTimeout's message."""
    return f"within {timeout}s" if blocking else "at once (blocking=False, one attempt)"


def check_blocking(blocking: object, timeout: float | None) -> bool:
    """``blocking``: a bool, False only without a ``timeout`` (one attempt waits for nothing)."""
    if not isinstance(blocking, bool):
        raise ValueError(f"blocking must be True or False, got {blocking!r}")
    if not blocking and timeout is not None:
        raise ValueError(
            f"can't specify a timeout for a non-blocking call (blocking=False, timeout={timeout!r})"
        )
    return blocking


class LockOptions(TypedDict, total=False):
    """A lock's defaults for ``with``: the longest wait, the fixed lease, one attempt or many.

    ``max_hold`` bounds every watchdog hold taken through the lock: past that
    many seconds the watchdog stops renewing it and declares it lost.
    """

    timeout: float | None
    lease: float | None
    blocking: bool
    max_hold: float | None


class KindScripts(NamedTuple):
    """The scripts one kind of lock sends, on one engine: a row of the family's table.

    Each lock class names its row in ``_kind_scripts`` (plain, fair,
    semaphore, each side of a read-write lock; sync or asyncio): acquire,
    release, waiting and force-release are written once, in :class:`RLock`
    and ``AsyncRLock``, and send what the row says.
    """

    acquire: Callable[..., Any]
    release: Callable[..., Any]
    abandon: Callable[..., Any]
    force_release: Callable[..., Any]

    @classmethod
    def of(cls, scripts: Any) -> KindScripts:
        """The row of a script set whose four scripts bear these names (lock, semaphore)."""
        return cls(scripts.acquire, scripts.release, scripts.abandon, scripts.force_release)


class WaitingShell(Protocol):
    """The I/O shell an :class:`AcquirePlan` is driven through (see :mod:`~.plan`).

    ``attempt``, ``listen`` and a ``subscription`` are what the plan calls
    (sync or awaited); ``close`` is the shell's own way out, without I/O waits.
    """

    def close(self, *, registered: bool) -> None:
        """Unsubscribe, and leave the waiting set when ``registered`` says the caller entered it."""


class LockEngine(Protocol):
    """What a lock of any kind needs of its client: the deployment's facts and its registry.

    The sync :class:`~django_rlock.core.LockClient` is one (an asyncio client
    lends its locks its sync engine's); each engine's shells ask a little more
    of their own client (``Client`` in ``_sync/shell.py`` and ``_aio/shell.py``).
    """

    key_prefix: str
    #: ``"rlock"`` or ``"redisson"`` (:mod:`~django_rlock.core._protocol.layouts`).
    layout: str
    watchdog_timeout: float
    #: Seconds a plain lock's waiter waits before it looks for a deadlock (None: never).
    deadlock_timeout: float | None
    min_replicas: int
    #: ``"publish"``, or ``"spublish"`` on a cluster with sharded pub/sub.
    publish_command: str
    #: How errors name the server (never with its credentials).
    server: str
    holds: HoldRegistry


def handoff_min_life(watchdog_timeout: float) -> float:
    """The least life left, in seconds, for a handed grant to be taken without a call.

    The watchdog renews on its own ticks (every third of the timeout) and
    declares a hold lost when a renewal could end within a margin (a sixth)
    of its deadline; a handed grant whose deadline is nearer than a tick and
    two margins could be declared lost while Redis keeps it. Its waiter
    confirms it with an acquire call instead, which renews it.
    """
    return renewal_interval(watchdog_timeout) + 2 * renewal_socket_timeout(watchdog_timeout)
