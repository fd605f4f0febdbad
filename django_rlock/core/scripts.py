"""The Lua scripts: one atomic, O(1) script per lock operation.

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

from typing import Any

from redis.commands.core import Script
from redis.exceptions import NoPermissionError, ResponseError

__all__ = [
    "ABANDON",
    "ACQUIRE",
    "ALLOW_OOM",
    "FORCE_RELEASE",
    "RELEASE",
    "RENEW",
    "REQUEST_LATCH_MS",
    "SCRIPT_COMMANDS",
    "LockScript",
    "LockScripts",
    "OomSafeScript",
    "is_unsupported_shebang",
    "permission_error",
]

#: Every command the scripts run. An ACL user needs them all (scripts' own
#: commands are checked too), besides EVALSHA, SCRIPT LOAD and the commands the
#: client sends itself (README: "Minimal ACL").
SCRIPT_COMMANDS = (
    "exists", "hexists", "hget", "hset", "hincrby", "pttl", "pexpire", "get", "set", "incr",
    "del", "zadd", "zrem", "zrange", "zremrangebyscore", "zcard", "publish", "time",
)  # fmt: skip

#: How long a request latch outlives its call, in milliseconds. It must cover
#: redis-py's whole retry window (10 retries with up to 1 s of backoff each by
#: default, plus reconnects); a latch costs ~100 bytes for that long.
REQUEST_LATCH_MS = 60_000

#: The first line of the scripts that must run even when Redis is out of memory.
ALLOW_OOM = "#!lua flags=allow-oom\n"

# Server time in milliseconds (scripts are replicated by effects, so TIME is allowed).
_NOW_MS = """
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""

# KEYS[1] lock hash, KEYS[2] fencing counter, KEYS[3] waiting set,
# KEYS[4] (optional) the owner's request latch
# ARGV[1] owner id, ARGV[2] expiry in milliseconds,
# ARGV[3] waiter id ('' for an attempt that will not wait),
# ARGV[4] the longest the waiter will sleep before trying again, in milliseconds,
# ARGV[5] (with KEYS[4]) this call's request id
# Returns {token, holds} when granted: a new grant INCRs the fencing counter, a
#   re-entry keeps the current token and adds one hold. A re-entry never
#   shortens the key's life (a short lease inside a watchdog hold must not
#   expire the outer hold). A granted waiter leaves the waiting set.
#   A resent call that was already granted (its latch holds its request id)
#   changes nothing and returns the same {token, holds}. Only the re-entry
#   branch can see such a resend: a first grant makes the owner a holder.
# Returns the holder's PTTL in ms (an integer; -1 when the key has no expiry)
#   when another owner holds the lock; a waiter is then (re-)entered in the
#   waiting set until just after its sleep ends, so a release can wake it.
ACQUIRE = (
    """
local ttl = tonumber(ARGV[2])
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if KEYS[4] and redis.call('set', KEYS[4], ARGV[5], 'px', LATCH_MS, 'get') == ARGV[5] then
        return {tonumber(redis.call('get', KEYS[2]) or '0'),
                tonumber(redis.call('hget', KEYS[1], ARGV[1]))}
    end
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    if redis.call('pttl', KEYS[1]) < ttl then
        redis.call('pexpire', KEYS[1], ttl)
    end
    return {tonumber(redis.call('get', KEYS[2]) or '0'), holds}
end
if redis.call('exists', KEYS[1]) == 0 then
    redis.call('hset', KEYS[1], ARGV[1], 1)
    redis.call('pexpire', KEYS[1], ttl)
    if ARGV[3] ~= '' then
        redis.call('zrem', KEYS[3], ARGV[3])
    end
    if KEYS[4] then
        redis.call('set', KEYS[4], ARGV[5], 'px', LATCH_MS)
    end
    return {redis.call('incr', KEYS[2]), 1}
end
local pttl = redis.call('pttl', KEYS[1])
if ARGV[3] ~= '' then
"""
    + _NOW_MS
    + """
    local sleep = tonumber(ARGV[4])
    if pttl >= 0 and pttl < sleep then
        sleep = pttl
    end
    -- The margin covers the waiter's own delay in re-registering after its sleep.
    local life = sleep + 500
    redis.call('zadd', KEYS[3], now + life, ARGV[3])
    if redis.call('pttl', KEYS[3]) < life then
        redis.call('pexpire', KEYS[3], life)
    end
end
return pttl
"""
).replace("LATCH_MS", str(REQUEST_LATCH_MS))

# KEYS[1] lock hash, KEYS[2] release channel, KEYS[3] waiting set,
# KEYS[4] (optional) the owner's request latch
# ARGV[1] owner id, ARGV[2] publish command ('publish', or 'spublish' on a cluster),
# ARGV[3] (with KEYS[4]) this call's request id
# Returns -1 when the owner holds nothing (nothing is changed), else the
#   owner's holds left. At 0 the lock is free, and the release is published
#   naming the waiter to wake: the registered waiter whose sleep ends first
#   (expired registrations are dropped), or '' (everyone) when none is left.
#   A resent call that was already applied changes nothing and returns the
#   owner's holds now (0 after a final release, even if another owner has
#   taken the lock since).
RELEASE = (
    """
if redis.call('hexists', KEYS[1], ARGV[1]) == 0 then
    if KEYS[4] and redis.call('get', KEYS[4]) == ARGV[3] then
        return 0
    end
    return -1
end
if KEYS[4] and redis.call('set', KEYS[4], ARGV[3], 'px', LATCH_MS, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', KEYS[1], ARGV[1]))
end
local holds = redis.call('hincrby', KEYS[1], ARGV[1], -1)
if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])
local target = ''
if redis.call('exists', KEYS[3]) == 1 then
"""
    + _NOW_MS
    + """
    redis.call('zremrangebyscore', KEYS[3], '-inf', now)
    local first = redis.call('zrange', KEYS[3], 0, 0)
    if first[1] then
        target = first[1]
    end
end
redis.call(ARGV[2], KEYS[2], target)
return 0
"""
).replace("LATCH_MS", str(REQUEST_LATCH_MS))

# KEYS[1..n] lock hashes
# ARGV[1] expiry in milliseconds, ARGV[1+i] owner id of KEYS[i]
# Returns n integers: 1 renewed, 0 the owner no longer holds KEYS[i] (lost).
RENEW = """
local ttl = ARGV[1]
local renewed = {}
for i, key in ipairs(KEYS) do
    if redis.call('hexists', key, ARGV[i + 1]) == 1 then
        redis.call('pexpire', key, ttl)
        renewed[i] = 1
    else
        renewed[i] = 0
    end
end
return renewed
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
        "grant them with the lock key prefix and its channels (README: Minimal ACL)."
    )


class LockScript(Script):
    """A :class:`Script` whose ACL refusals say what is missing (see :func:`permission_error`)."""

    def __call__(  # type: ignore[override]  # narrower than redis-py's: only lists are passed
        self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        """Run the script (EVALSHA, loading it on NOSCRIPT)."""
        try:
            return super().__call__(keys=keys or [], args=args or [], client=client)
        except ResponseError as error:
            refused = permission_error(error)
            if refused is None:
                raise
            raise refused from error


def is_unsupported_shebang(error: ResponseError) -> bool:
    """Whether ``error`` is a server refusing to compile a ``#!lua flags=...`` script.

    Redis < 7 reads the shebang as Lua and fails to compile it; a server that
    knows shebangs but not the flag says so.
    """
    message = str(error).lower()
    return "compiling script" in message or "shebang" in message


class OomSafeScript:
    """A script that runs under OOM where the server allows it (Redis >= 7).

    Tries the ``allow-oom`` variant; if the server cannot compile it, falls
    back to the plain one for good. The choice costs one failed SCRIPT LOAD,
    once, on the first call; afterwards a call costs one attribute lookup more
    than a plain :class:`Script`.
    """

    def __init__(self, redis: Any, body: str) -> None:
        self._plain = LockScript(redis, body)
        self._script = LockScript(redis, ALLOW_OOM + body)

    @property
    def flagged(self) -> bool:
        """True while the ``allow-oom`` variant is in use."""
        return self._script is not self._plain

    def __call__(
        self, keys: list[Any] | None = None, args: list[Any] | None = None, client: Any = None
    ) -> Any:
        """Run the script as :class:`Script` does (EVALSHA, loading it on NOSCRIPT)."""
        # The variant this call uses, read once: another thread may switch
        # `_script` to the plain one while this call is still failing on the flag.
        script = self._script
        try:
            return script(keys=keys or [], args=args or [], client=client)
        except ResponseError as error:
            if script is self._plain or not is_unsupported_shebang(error):
                raise
            self._script = self._plain
            return self._plain(keys=keys or [], args=args or [], client=client)


class LockScripts:
    """The lock scripts, registered against one Redis client.

    Acquire stays a plain script: under OOM its first write is refused, so it
    fails whole, with Redis's OOM error, before changing anything.
    """

    def __init__(self, redis: Any) -> None:
        self.acquire = LockScript(redis, ACQUIRE)
        self.release = OomSafeScript(redis, RELEASE)
        self.renew = OomSafeScript(redis, RENEW)
        self.force_release = OomSafeScript(redis, FORCE_RELEASE)
        self.abandon = OomSafeScript(redis, ABANDON)
