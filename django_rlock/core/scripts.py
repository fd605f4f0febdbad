"""The Lua scripts: one atomic, O(1) script per lock operation.

They are composed from the pieces every lock kind shares
(:mod:`~django_rlock.core.snippets`: the clock, the fencing rule, the request
latch, grants, waiter registration, release and wake-up); the sibling kinds'
scripts (fair lock, read-write lock, semaphore) are made of the same pieces.

Each script is run with EVALSHA through redis-py's ``Script``, which reloads it
when the server answers NOSCRIPT (after a restart or ``SCRIPT FLUSH``), so a
flushed script cache costs one extra round trip and nothing else.

Lost replies. redis-py resends a command when the connection breaks before
the reply arrives, but the server may already have run it. Acquire and release
are therefore made idempotent by a *request latch*: the caller sends a request
id, unique per call, and the script records it in a key of the owner's own
(``<lock>:req:<owner>``, same hash slot, :data:`REQUEST_LATCH_MS` to live). A
resent call finds its id already there and reports the current state instead
of applying itself twice. The latch is written with ``SET ... GET``, so the
common path pays one command inside the script and no extra round trip; the
callers that never resend (RedLock's bounded connections, replica undo) leave
the latch out.

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

from collections.abc import Callable
from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoPermissionError, ResponseError

from django_rlock.core.snippets import (
    CURRENT_TOKEN,
    NEXT_TOKEN_LUA,
    NOW_MS_LUA,
    REQUEST_LATCH_MS,
    drop_lost_grant,
    new_grant,
    register_waiter,
    release_one,
    report_or_reenter,
    wake_after_release,
)

__all__ = [
    "ABANDON",
    "ACQUIRE",
    "ALLOW_OOM",
    "FORCE_RELEASE",
    "NEXT_TOKEN_LUA",
    "NOW_MS_LUA",
    "RELEASE",
    "RENEW",
    "REQUEST_LATCH_MS",
    "SCRIPT_COMMANDS",
    "LockScript",
    "LockScripts",
    "MakeScript",
    "OomFallback",
    "OomSafeBase",
    "OomSafeScript",
    "ScriptFactory",
    "ScriptSet",
    "is_unsupported_shebang",
    "permission_error",
    "raise_if_refused",
]

#: Every command the scripts run. An ACL user needs them all (scripts' own
#: commands are checked too), besides EVALSHA, SCRIPT LOAD and the commands the
#: client sends itself (docs/acl-and-tls.md: "Minimal ACL").
SCRIPT_COMMANDS = (
    "exists", "hexists", "hget", "hset", "hincrby", "pttl", "pexpire", "get", "set", "del",
    "zadd", "zrem", "zrange", "zremrangebyscore", "zcard", "publish", "time",
    "sadd", "srem", "smembers", "zscore", "hdel",
)  # fmt: skip

#: The first line of the scripts that must run even when Redis is out of memory.
ALLOW_OOM = "#!lua flags=allow-oom\n"

# KEYS[1] lock hash, KEYS[2] fencing counter, KEYS[3] waiting set,
# KEYS[4] (optional) the owner's request latch
# ARGV[1] owner id, ARGV[2] expiry in milliseconds,
# ARGV[3] waiter id ('' for an attempt that will not wait),
# ARGV[4] the longest the waiter will sleep before trying again, in milliseconds,
# ARGV[5] (with KEYS[4]) this call's request id,
# ARGV[6] the owner's holds of this lock that its client has declared lost, or
#   given up while the server may still count them (core/lostholds.py; 0: none;
#   only whether there are any matters), ARGV[7] the token of those holds,
# ARGV[8] who asks, for operators (core/holder.py: JSON, never the owner id;
#   '' for none): a new grant stores it in the hash as '~holder', with the
#   server's clock in ms as '~since' (owner ids never start with '~'), so it
#   is renewed, expires and is deleted with the lock, at no round trip
# Returns {token, holds, pttl} when granted, pttl being the key's life left in
#   ms after the call: the caller's deadline is its send time + pttl, whatever
#   the branch. A new grant's token is max(last token + 1, the server's clock
#   in microseconds), so tokens keep increasing when Redis loses the counter
#   (a restart without persistence, FLUSHALL, a failover), and the counter
#   expires with the lock: whenever the lock's expiry is set, the counter's is
#   set to the same. A re-entry keeps the current token, adds one hold, and
#   never shortens the key's life (a short lease inside a watchdog hold must
#   not expire the outer hold). A granted waiter leaves the waiting set.
#   A resent call that was already granted (its latch holds its request id)
#   changes nothing and returns the same {token, holds} with the PTTL left
#   now: the grant happened at the first call, not at the resend. Only the
#   re-entry branch can see such a resend: a first grant makes the owner a holder.
#   Holds the client has declared lost (ARGV[6]) may still be on the server (a
#   loss declared on the local deadline while the key lived on): while the
#   token is still theirs, all of the owner's holds are taken off first (also
#   re-entries the server applied but whose replies were lost), before the
#   request latch is read, so the call is a new grant with a new token, never a
#   re-entry of a hold its owner was told is gone, nor a report of one.
# Returns the holder's PTTL in ms (an integer; -1 when the key has no expiry)
#   when another owner holds the lock; a waiter is then (re-)entered in the
#   waiting set until just after its sleep ends, so a release can wake it.
ACQUIRE = (
    """
local ttl = tonumber(ARGV[2])
"""
    + drop_lost_grant()
    + report_or_reenter(latch="4", token=CURRENT_TOKEN, fence="KEYS[2]")
    + """
if redis.call('exists', KEYS[1]) == 0 then
"""
    + new_grant(latch="4")
    + """
end
local pttl = redis.call('pttl', KEYS[1])
"""
    + register_waiter()
)

# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] waiting set,
# KEYS[4] (optional) the owner's request latch
# ARGV[1] owner id, ARGV[2] publish command ('publish', or 'spublish' on a cluster),
# ARGV[3] (with KEYS[4]) this call's request id
# Returns -1 when the owner holds nothing (nothing is changed), else the
#   owner's holds left. At 0 the lock is free, and when a registered waiter is
#   left (expired registrations are dropped) the release is published naming
#   the one to wake: the waiter whose sleep ends first. With no waiter left,
#   nothing is published (a PUBLISH costs the server a channel lookup, and the
#   client a bigger script, on every uncontended release).
#   A resent call that was already applied changes nothing and returns the
#   owner's holds now (0 after a final release, even if another owner has
#   taken the lock since).
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
#   Every caller of this script (release, the replica-sync undo in client.py,
#   MultiLock's members, RedLock's undo of an unanswered grant) releases a
#   plain lock hash, and every sleeper of those locks is an RLock acquire plan
#   (MultiLock waits through its members' plans; RedLock never sleeps on a
#   channel, it retries after a random pause). On a cluster, the set, the hash
#   and the channel share one slot, so this check and SPUBLISH run on the node
#   the waiter's SSUBSCRIBE is on.
#   The one waiter this misses is one whose entry expired while it still
#   sleeps: its client paused for more than 500 ms, or the server's clock
#   jumped forward. Before, a release with no live entry woke everyone; that
#   waiter now sleeps out its own bound (the holder's PTTL, at most the
#   watchdog timeout), exactly as a lost message costs it, and as it already
#   did whenever another live waiter was named instead. force_release still
#   wakes every waiter (an operator's recovery tool, not a hot path), and
#   ABANDON hands a wake-up on only while the set has members.
RELEASE = release_one(latch="4") + wake_after_release(waiters="KEYS[3]", channel="KEYS[2]")

# KEYS[2i-1] the i-th lock hash, KEYS[2i] its fencing counter
# ARGV[1] expiry in milliseconds,
# ARGV[2] '1' to set that expiry even if shorter (MultiLock's re-expiry of a
#   grant it has just made), '0' to never shorten a key's life (the watchdog:
#   a watchdog re-entry inside a longer lease must not cut the lease short),
# ARGV[2+i] owner id of the i-th lock
# Returns one integer per lock: the key's PTTL in ms after the call (> 0:
#   renewed; the caller's deadline is its send time + it), or 0 when the owner
#   no longer holds it (lost). The counter gets the same expiry as the lock.
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
            redis.call('pexpire', fence, ttl)
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
# A waiter leaves without the lock (its wait ran out). If the lock is free, a
#   release may have woken this waiter alone: wake the others instead.
# Returns 1 when the others were woken, else 0.
ABANDON = """
redis.call('zrem', KEYS[3], ARGV[1])
if redis.call('exists', KEYS[1]) == 0 and redis.call('zcard', KEYS[3]) > 0 then
    redis.call(ARGV[2], KEYS[2], '')
    return 1
end
return 0
"""


#: How servers word an ACL refusal inside a script: Redis ("... can't run this
#: command ...", "... can't access at least one of the keys ..."), Valkey 8.
_SCRIPT_ACL_REFUSALS = ("The user executing the script can't", "ACL failure in script")


def permission_error(error: ResponseError) -> NoPermissionError | None:
    """A clear NOPERM error for an ACL refusal inside a script, else None.

    A command refused inside a script comes back as a plain error: Redis names
    neither the command nor the cause ("The user executing the script can't run
    this command or subcommand"), Valkey names the command ("ACL failure in
    script: User u has no permissions to run the 'set' command"). The caller gets
    what to grant instead.
    """
    message = str(error)
    if not any(marker in message for marker in _SCRIPT_ACL_REFUSALS):
        return None
    return NoPermissionError(
        "NOPERM: the Redis ACL user may not run a command the lock scripts need "
        f"({message.strip()}). The scripts run: {' '.join(SCRIPT_COMMANDS)}; "
        "grant them with the lock key prefix and its channels "
        '(docs/acl-and-tls.md, "Minimal ACL").'
    )


def is_unsupported_shebang(error: ResponseError) -> bool:
    """Whether ``error`` is a server refusing to compile a ``#!lua flags=...`` script.

    Redis < 7 reads the shebang as Lua and fails to compile it; a server that
    knows shebangs but not the flag says so.
    """
    message = str(error).lower()
    return "compiling script" in message or "shebang" in message


class OomFallback:
    """Which variant of an ``allow-oom`` script to send, and when to fall back (no I/O).

    The flagged variant is sent until a server refuses to compile it; then
    the plain one, for good. The decision is made on the variant a call
    *sent*, not on the current choice: when many calls race the first load,
    each one refused for the flag retries with the plain variant, even if
    another has switched the choice meanwhile.
    """

    def __init__(self) -> None:
        #: True while the ``allow-oom`` variant is in use.
        self.flagged = True

    def retry_plain(self, sent_flagged: bool, error: ResponseError) -> bool:
        """Whether a call that sent the ``sent_flagged`` variant and got ``error`` resends plain."""
        if not sent_flagged or not is_unsupported_shebang(error):
            return False
        self.flagged = False
        return True


def raise_if_refused(error: ResponseError) -> None:
    """Raise the clear NOPERM error for an ACL refusal inside a script (from ``error``)."""
    refused = permission_error(error)
    if refused is not None:
        raise refused from error


class LockScript(Script):
    """A :class:`Script` whose ACL refusals say what is missing (see :func:`permission_error`)."""

    def __call__(  # type: ignore[override]  # narrower than redis-py's: only lists are passed
        self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        """Run the script (EVALSHA, loading it on NOSCRIPT)."""
        try:
            return super().__call__(keys=keys or [], args=args or [], client=client)
        except ResponseError as error:
            raise_if_refused(error)
            raise


class OomSafeBase:
    """What the sync and asyncio ``allow-oom`` scripts share: both variants and the policy."""

    def __init__(self, make: Callable[[str], Any], body: str) -> None:
        self._plain = make(body)
        self._variants = {True: make(ALLOW_OOM + body), False: self._plain}
        self._policy = OomFallback()

    @property
    def flagged(self) -> bool:
        """True while the ``allow-oom`` variant is in use."""
        return self._policy.flagged

    def _choose(self) -> tuple[bool, Any]:
        flagged = self._policy.flagged
        return flagged, self._variants[flagged]

    def _after(self, flagged: bool, error: ResponseError) -> Any:
        """The plain variant to resend a refused call with (or re-raise ``error``)."""
        if not self._policy.retry_plain(flagged, error):
            raise error
        return self._plain


class OomSafeScript(OomSafeBase):
    """A script that runs under OOM where the server allows it (Redis >= 7).

    Tries the ``allow-oom`` variant; if the server cannot compile it, falls
    back to the plain one for good (:class:`OomFallback`). The choice costs
    one failed SCRIPT LOAD, once, on the first call.
    """

    def __init__(self, redis: Any, body: str) -> None:
        super().__init__(lambda text: LockScript(redis, text), body)

    def __call__(
        self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        """Run the script as :class:`Script` does (EVALSHA, loading it on NOSCRIPT)."""
        flagged, script = self._choose()
        try:
            return script(keys=keys or [], args=args or [], client=client)
        except ResponseError as error:
            return self._after(flagged, error)(keys=keys or [], args=args or [], client=client)


#: How a script set makes one script of a body for one client: :class:`LockScript`,
#: :class:`OomSafeScript` or their asyncio twins.
ScriptFactory = Callable[[Any, str], Any]

#: The same, with the client already given: a body in, a script out.
MakeScript = Callable[[str], Any]


class ScriptSet:
    """One kind's scripts, registered against one Redis client (sync or asyncio).

    A subclass's :meth:`register` makes each script with ``plain`` when it may
    create keys (under OOM its first write is refused, so it fails whole, with
    Redis's OOM error, before changing anything) or with ``oom_safe`` when it
    gives back or only deletes (it runs under OOM where Redis allows it).
    """

    def __init__(
        self,
        redis: Any,
        plain: ScriptFactory = LockScript,
        oom_safe: ScriptFactory = OomSafeScript,
    ) -> None:
        self.register(lambda body: plain(redis, body), lambda body: oom_safe(redis, body))

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make this kind's scripts as attributes."""
        raise NotImplementedError


class LockScripts(ScriptSet):
    """The plain lock's scripts; acquire stays plain (see :class:`ScriptSet`)."""

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the lock's scripts."""
        self.acquire = plain(ACQUIRE)
        self.release = oom_safe(RELEASE)
        self.renew = oom_safe(RENEW)
        self.force_release = oom_safe(FORCE_RELEASE)
        self.abandon = oom_safe(ABANDON)
