"""Redisson's layout of the plain lock (``layout="redisson"``): its keys, Lua and calls (no I/O).

A client with ``layout="redisson"`` makes locks that a Java service running
Redisson shares: its ``RLock`` (and ``RFencedLock``) of the same name, on the
same Redis. Both sides then exclude each other, wake each other's waiters, see
and can force-release each other's holds, and draw fencing tokens from one
counter. The wire contract, from Redisson's ``RedissonLock``,
``RedissonBaseLock``, ``LockPubSub`` and ``RedissonFencedLock``::

    <name>                            HASH     '<uuid>:<thread id>' -> hold count; nothing else
    redisson_lock__channel:{<name>}   CHANNEL  '0' on every full release and force-release
    redisson_lock_token:{<name>}      STRING   RFencedLock's counter (INCR, no expiry set)

(``P:{<name>}`` is Redisson's ``prefixName``; a name that has a '{' is used
as ``P:<name>``, so every key stays in the name's cluster slot.) The name *is*
the key: no ``KEY_PREFIX``, no hash tag added, as Redisson's default
``NameMapper``. What this library keeps beyond Redisson's state lives in keys
of its own, in the same slot, that no Redisson script reads, all under the
client's ``key_prefix`` (a name that has a '{' gives ``<prefix>:redisson:tag:<name>``)::

    <prefix>:redisson:{<name>}:holder       HASH    '~t', the token of a Python hold,
                                                    and '~holder', '~task', '~since', its
                                                    description (which the default
                                                    layout keeps in the lock's hash);
                                                    expires and is renewed with the lock
    <prefix>:redisson:{<name>}:req:<owner>  STRING  the owner's request latch (lost replies)

What stays as in the default layout: owners are the calling thread (or task),
``<process UUID>:<thread number>``, Redisson's shape
(:mod:`~django_rlock.core._process.identity`); reentrancy, the watchdog (only
this side's holds, ``hexists`` then ``pexpire``, as Redisson's own watchdog
renews only its own), lost-hold detection, the request latch, deadlines and
holder descriptions.

What changes:

* **Wake-ups.** Redisson's waiters register nowhere and Redisson decodes every
  message as a Java long, so a release here publishes ``0`` on every full
  release (Redisson's ``UNLOCK_MESSAGE``), waiters or not, and a waiter here
  wakes on any message of the channel, Redisson's ``0`` included
  (:class:`~django_rlock.core._protocol.channels.ChannelTable`). There is no
  waiting set, so a waiter that gives up has nothing to leave.
* **Fencing tokens** come from Redisson's ``RFencedLock`` counter: a new grant
  here sets it to ``max(counter + 1, the server's clock in microseconds)``
  (the default layout's rule), and Redisson's next ``INCR`` continues above
  it, so tokens strictly increase across both sides. The counter expires as
  the default layout's token does, with the lock: a grant here gives it the
  grant's life, and a full release here sets it again (to at least the
  released token) with what was left of the lock's life, so a name locked
  once does not keep a key forever. The token of a hold of this side is
  also kept beside its description (``~t``), renewed with it: re-entries
  and lost-hold checks read that one, whatever became of the counter. The
  clock floor keeps this side's tokens increasing when the counter is gone
  (expired, or lost by Redis). Redisson's ``INCR`` keeps the counter's
  expiry: once it has run out (a name no Python process locked for that
  long), Redisson's tokens restart at 1 until this side's next grant lifts
  the counter above the clock, as they do when Redis loses it.
* **Re-entry** never shortens the key's life (the default layout's rule;
  Redisson's re-entry resets it to the new lease). Each side re-enters only
  its own holds, so neither rule meets the other.

Names that Redisson cannot use on a Redis Cluster are refused
(:func:`check_redisson_name`), on every deployment, so that a name that works
beside one server keeps working on a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Any, ClassVar, Unpack

from django_rlock.core._protocol.calls import ScriptCall
from django_rlock.core._protocol.layouts import REDISSON
from django_rlock.core._protocol.lock import TOKEN_FIELD, LockOptions, MakeScript, ScriptSet
from django_rlock.core._protocol.lockbase import LockBase
from django_rlock.core._protocol.lua import (
    REQUEST_LATCH_MS,
    next_token,
    release_one,
    report_or_reenter,
    store_holder,
)
from django_rlock.core._protocol.names import LockKeys
from django_rlock.core.exceptions import InvalidLockNameError

#: Redisson's ``LockPubSub.UNLOCK_MESSAGE``: each Redisson instance wakes one of its
#: waiting threads. (``1``, ``READ_UNLOCK_MESSAGE``, wakes all of them.)
UNLOCK_MESSAGE = "0"


def prefix_name(prefix: str, name: str) -> str:
    """Redisson's ``prefixName``: ``prefix:{name}``, or ``prefix:name`` when the name has a '{'."""
    if "{" in name:
        return f"{prefix}:{name}"
    return f"{prefix}:{{{name}}}"


def _own(prefix: str, name: str) -> str:
    """The base of this library's own keys beside lock ``name``: in its slot, one per name.

    ``prefixName`` would give the names ``a`` and ``{a}`` one key (Redisson's
    own channel does), so a name that brings its own hash tag is marked.
    """
    head = f"{prefix}:redisson" if prefix else "redisson"
    if "{" in name:
        return f"{head}:tag:{name}"
    return f"{head}:{{{name}}}"


def check_redisson_name(name: str) -> str:
    """``name`` (already checked by ``check_name``) if Redisson can use it on a cluster.

    Redisson derives a lock's channel and token keys as ``P:{name}``, or
    ``P:name`` when the name has a '{': they are in the name's slot only when
    the name has no braces at all, or opens with a real hash tag (its first
    '}' comes after its first '{', with something between). Any other brace
    puts Redisson's own keys in other slots (CROSSSLOT on a cluster), so the
    name is refused here on every deployment.
    """
    opening, closing = name.find("{"), name.find("}")
    if opening == -1 and closing == -1:
        return name
    if opening != -1 and closing > opening + 1:
        return name
    raise InvalidLockNameError(
        f"lock name {name!r} cannot be shared with Redisson (layout='redisson'): braces in a "
        "name must form a hash tag, '{' then '}' with something between, before any other "
        "'}'; otherwise Redisson's channel and token keys land in other cluster slots than "
        "the lock (Redisson itself cannot use such a name on a Redis Cluster)"
    )


@dataclass(frozen=True, slots=True)
class RedissonKeys(LockKeys):
    """The keys of one lock in Redisson's layout (see the module).

    ``hash`` is the name itself; ``fence``, the key renewed with the hash
    (see :meth:`LockBase.hold_keys`), is :attr:`holder`, never the token
    counter, which must not expire; ``waiters`` is never written (no waiter
    registers in this layout).
    """

    #: Redisson's RFencedLock counter.
    token: str
    #: This library's holder description of a Python hold.
    holder: str
    #: The base of this library's own keys (the owners' latches are ``<own>:req:<owner>``).
    own: str

    def latch(self, owner: str) -> str:
        """The request latch of ``owner`` on this lock, a key of this library's own."""
        return f"{self.own}:req:{owner}"


def redisson_keys(prefix: str, name: str) -> RedissonKeys:
    """The keys of lock ``name`` (checked) in Redisson's layout, ours under ``prefix``."""
    own = _own(prefix, name)
    return RedissonKeys(
        name=name,
        hash=name,
        fence=f"{own}:holder",
        waiters=f"{own}:waiters",
        channel=prefix_name("redisson_lock__channel", name),
        token=prefix_name("redisson_lock_token", name),
        holder=f"{own}:holder",
        own=own,
    )


# KEYS[1] the lock hash (the name: Redisson's RLock), KEYS[2] Redisson's
#   RFencedLock counter, KEYS[3] the holder description (ours),
#   KEYS[4] (optional) the owner's request latch (ours)
# ARGV as the default layout's lock.ACQUIRE: ARGV[1] owner id, ARGV[2] expiry
#   in ms, ARGV[3] and ARGV[4] (waiter id, sleep) unused: nobody registers, as
#   every full release publishes; ARGV[5] (with KEYS[4]) request id, ARGV[6]
#   and ARGV[7] the owner's holds declared lost and their token, ARGV[8] who
#   asks ('' for none)
# Returns {token, holds, pttl} when granted (as lock.ACQUIRE), else the
#   holder's PTTL in ms, whichever side holds it.
#   Holds declared lost go first, while KEYS[3]'s token is still theirs (no
#   grant of this side since; a Java RLock can only have taken the lock once
#   our field was gone, and never writes KEYS[3]).
#   A re-entry keeps the current token (KEYS[3]'s '~t'). A new grant sets the
#   counter to max(counter + 1, the server's clock in microseconds), expiring
#   with the grant (RELEASE sets it again when this side lets go); the hash
#   gets the owner's field only, the token and the description go to
#   KEYS[3], with the same expiry, made anew: the Java side may have freed
#   the lock without deleting it, and an earlier holder's '~task' must not
#   outlive its hold.
# The new grant of ACQUIRE (the lock is free): defines `token` (next_token),
# writes the owner's field alone in the hash, the token and description beside it.
_NEW_GRANT = Template(
    next_token(counter="KEYS[2]")
    + """
local fence = string.format('%.0f', token)
redis.call('hset', KEYS[1], ARGV[1], 1)
redis.call('pexpire', KEYS[1], ttl)
redis.call('del', KEYS[3])
if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
    + store_holder(
        key="KEYS[3]",
        fields="'$token', fence, '~since', string.format('%.0f', since)",
        description="ARGV[8]",
        indent="    ",
    )
    + """else
    redis.call('hset', KEYS[3], '$token', fence)
end
redis.call('pexpire', KEYS[3], ttl)
if KEYS[4] then
    redis.call('set', KEYS[4], ARGV[5], 'px', $latch_ms)
end
redis.call('set', KEYS[2], fence, 'px', ttl)
return {token, 1, ttl}
"""
)


#: The token of this side's hold, as a Lua expression: KEYS[3]'s '~t' (0 when gone).
_HOLD_TOKEN = f"tonumber(redis.call('hget', KEYS[3], '{TOKEN_FIELD}') or '0')"


ACQUIRE = (
    Template("""
local ttl = tonumber(ARGV[2])
if tonumber(ARGV[6] or '0') ~= 0 and redis.call('hget', KEYS[3], '$token') == ARGV[7] then
    if redis.call('hdel', KEYS[1], ARGV[1]) == 1 then
        redis.call('del', KEYS[3])
    end
end
""").substitute(token=TOKEN_FIELD)
    + report_or_reenter(latch="4", token=_HOLD_TOKEN, fence="KEYS[3]")
    + """
if redis.call('exists', KEYS[1]) == 0 then
"""
    + _NEW_GRANT.substitute(latch_ms=REQUEST_LATCH_MS, token=TOKEN_FIELD)
    + """end
return redis.call('pttl', KEYS[1])
"""
)


# KEYS[1] the lock hash, KEYS[2] Redisson's channel, KEYS[3] the holder's
#   token and description, KEYS[4] Redisson's RFencedLock counter,
#   KEYS[5] (optional) the owner's request latch
# ARGV[1] owner id, ARGV[2] publish command ('publish' or 'spublish'),
#   ARGV[3] (with KEYS[5]) request id
# Returns -1 when the owner holds nothing (nothing is changed), else the
#   owner's holds left (a resend reports, as lock.RELEASE). At 0 the lock and
#   KEYS[3] are deleted, the counter gets what was left of the lock's life,
#   or, when it expired during a long hold, is set again to the released
#   token (Redisson's next INCR must continue above this side's tokens; while
#   this side held the lock, nobody else wrote the counter), and
#   Redisson's UNLOCK_MESSAGE, '0', is published, waiters or not: Redisson's
#   waiters register nowhere.
RELEASE = release_one(latch="5") + Template("""local life = redis.call('pttl', KEYS[3])
if life > 0 and redis.call('pexpire', KEYS[4], life) == 0 then
    local fence = redis.call('hget', KEYS[3], '$token')
    if fence then
        redis.call('set', KEYS[4], fence, 'px', life)
    end
end
redis.call('del', KEYS[3])
redis.call(ARGV[2], KEYS[2], '$message')
return 0
""").substitute(message=UNLOCK_MESSAGE, token=TOKEN_FIELD)


# KEYS[1] the lock hash, KEYS[2] Redisson's channel, KEYS[3] the holder description
# ARGV[1] publish command
# Returns 1 when a held lock (either side's) was deleted, and '0' published
#   (as Redisson's forceUnlock), else 0.
FORCE_RELEASE = Template("""
redis.call('del', KEYS[3])
if redis.call('del', KEYS[1]) == 1 then
    redis.call(ARGV[1], KEYS[2], '$message')
    return 1
end
return 0
""").substitute(message=UNLOCK_MESSAGE)


class RedissonScripts(ScriptSet):
    """The Redisson layout's lock scripts; renewals and extend use the default RENEW.

    RENEW (``hexists`` then ``pexpire``, on the hash and the key renewed with
    it) is the same in both layouts, and renews only the caller's own fields.
    """

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the scripts: acquire may create keys (plain), the others give back."""
        self.acquire = plain(ACQUIRE)
        self.release = oom_safe(RELEASE)
        self.force_release = oom_safe(FORCE_RELEASE)


def acquire_on(keys: RedissonKeys, owner: str, call: ScriptCall) -> ScriptCall:
    """The default layout's acquire ``call`` (its ARGV and request id) on Redisson's keys."""
    return ScriptCall(
        keys=[keys.hash, keys.token, keys.holder, keys.latch(owner)], args=call.args, rid=call.rid
    )


def release_on(keys: RedissonKeys, owner: str, call: ScriptCall) -> ScriptCall:
    """The default layout's release ``call`` (owner, publish, request id) on Redisson's keys."""
    return ScriptCall(
        keys=[keys.hash, keys.channel, keys.holder, keys.token, keys.latch(owner)],
        args=call.args,
        rid=call.rid,
    )


def force_release_on(keys: RedissonKeys, publish: str) -> ScriptCall:
    """Delete the lock whoever holds it, on either side, and wake both sides' waiters."""
    return ScriptCall(keys=[keys.hash, keys.channel, keys.holder], args=[publish])


def nothing_to_leave(**_call: Any) -> int:
    """The abandon step of this layout: no waiter registers, so a waiter leaves nothing."""
    return 0


class RedissonBase(LockBase):
    """What the Redisson layout's plain lock adds to both engines' RLock (no I/O).

    Put before the engine's class (``class RedissonRLock(RedissonBase, RLock)``):
    the keys become Redisson's and the calls go to :class:`RedissonScripts`;
    acquiring, waiting, releasing and renewing are the engine's own.
    """

    layout: ClassVar[str] = REDISSON

    #: The lock's keys in Redisson's layout (also :attr:`keys`).
    redisson_keys: RedissonKeys

    def __init__(self, engine: Any, name: str, **options: Unpack[LockOptions]) -> None:
        # ``engine``: the shell's client (the engine's class takes it first).
        super().__init__(engine, check_redisson_name(name), **options)
        self.redisson_keys = redisson_keys(self._engine.key_prefix, name)
        self.keys = self.redisson_keys

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        """The acquire call on Redisson's keys (nobody registers: no waiter id)."""
        return acquire_on(self.redisson_keys, owner, super()._acquire_call(owner, lease, "", 0.0))

    def _description_key(self) -> str | None:
        return self.redisson_keys.holder  # its own hash: Redisson's lock hash holds owners only

    def _release_call(self, owner: str) -> ScriptCall:
        """One release of one hold on Redisson's keys."""
        return release_on(self.redisson_keys, owner, super()._release_call(owner))

    def _force_release_call(self) -> ScriptCall:
        """A force-release on Redisson's keys, announced as Redisson's forceUnlock does."""
        return force_release_on(self.redisson_keys, self._engine.publish_command)
