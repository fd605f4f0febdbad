"""The Lua pieces the lock kinds' scripts are made of (no I/O).

The plain lock (:mod:`~django_rlock.core._protocol.lock`), the fair lock, the
read-write lock and the semaphore share their rules: one clock, one fencing
rule, one request latch, one way a grant is written, a waiter registers and a
release wakes. Each rule is written once, here, as a snippet or as a function
returning the snippet for the keys a script passes; each kind's module composes
its scripts from these and from what is really its own.

The comment at each snippet is its contract: the KEYS, ARGV, fields and
locals it expects (there, a field reads $name and a Lua local is in single
backquotes), and the locals it defines or what it returns.

How a snippet is filled: a snippet that depends on the script it goes in is a
:class:`string.Template` whose parameters are named fields (``KEYS[$latch]``,
``$latch_ms``, ``$waiters``, ...), and the function beside it fills every
field from its keyword arguments with ``substitute``, which raises
``KeyError`` on a field left out or misspelled. So a script reads
``new_grant(latch="4")``, and no field of this module is left for a script to
fill. A field that takes a block of lines (a kind's own step, possibly empty)
stands alone on a line ending in a backslash, and in braces (``${handoff}``),
as the backslash joins the next line to it: the block brings its own line
ends, and an empty one leaves no blank line. Lua has no ``$``, so a
template's only ``$`` are its fields.
"""

from __future__ import annotations

import textwrap
from string import Template

#: How long a request latch outlives its call, in milliseconds. It must cover
#: redis-py's whole retry window (10 retries with up to 1 s of backoff each by
#: default, plus reconnects); a latch costs ~100 bytes for that long.
REQUEST_LATCH_MS = 60_000


#: How long a waiter's registration outlives the sleep it announced, in ms: the
#: waiter's own delay between waking and its next attempt.
WAITER_MARGIN_MS = 500


# Defines `clock` (the TIME reply) and `now`: the server's time in ms (scripts
# are replicated by effects, so TIME is allowed).
NOW_MS_LUA = """
local clock = redis.call('time')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""


# Expects $counter the fencing counter (KEYS[2] in a new grant), read as
# $last (GET, or HGET of a field when the last token is a hash's field).
# Defines `clock` (the TIME reply) and `token`: the next fencing token,
# max(last + 1, the server's time in microseconds). It fits a Lua number (a double, exact
# below 2^53, which the clock reaches in the year 2255), a signed 64-bit
# integer and a Postgres bigint; whoever stores it writes it with '%.0f', as
# Lua would write a number this large as '1.7e+15'.
_NEXT_TOKEN = Template("""
local clock = redis.call('time')
local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local last = tonumber($last or '0') or 0
if token <= last then
    token = last + 1
end
""")


def next_token(*, counter: str = "KEYS[2]", field: str | None = None) -> str:
    """Define ``token``, the next fencing token after the one in the key ``counter``.

    ``field``: the last token is that field of the hash ``counter`` (None: the
    key is a plain counter).
    """
    last = (
        f"redis.call('get', {counter})"
        if field is None
        else f"redis.call('hget', {counter}, '{field}')"
    )
    return _NEXT_TOKEN.substitute(last=last)


#: The token of the current grant, as a Lua expression: the fencing counter
#: KEYS[2] (0 when it is gone).
CURRENT_TOKEN = "tonumber(redis.call('get', KEYS[2]) or '0')"


# Expects $description a holder's description as its client sent it
# (core/_process/holder.py: its process part, then, when a Celery task holds
# the lock, '\31' and its task part; '' for none). HSETs $key's $fields
# (Lua arguments: field, value, ...) and the description, its process part as
# '~holder', its task part, if any, as '~task': each part at most 64 bytes
# (the client bounds them), so the hash stays a listpack, where the whole
# description in one field would often not. A description of a previous
# release (JSON, whose control characters are escaped) has no '\31': all of
# it is '~holder', as that release stored it. Defines the local `cut`.
_STORE_HOLDER = Template("""\
local cut = string.find($description, '\\31', 1, true)
if cut then
    redis.call('hset', $key, $fields, '~holder', string.sub($description, 1, cut - 1),
               '~task', string.sub($description, cut + 1))
else
    redis.call('hset', $key, $fields, '~holder', $description)
end
""")


def store_holder(*, key: str, fields: str, description: str, indent: str = "") -> str:
    """HSET ``key``'s ``fields`` and the description ``description`` (Lua expressions).

    ``indent`` goes before each line (the block's place in its script).
    """
    lua = _STORE_HOLDER.substitute(key=key, fields=fields, description=description)
    return textwrap.indent(lua, indent)


# Expects KEYS[1] the lock hash, KEYS[2] its fencing counter, ARGV[1] owner id,
# ARGV[6] the owner's holds its client declared lost (0: none), ARGV[7] their token.
# Takes the lost grant off first, before the latch is read, so a lost grant is
# never reported again, even to a retry of a call that re-entered it. While
# the fence is still the lost grant's token, every hold the owner has is of
# that grant (a re-entry keeps the token), including re-entries whose replies
# were lost (so the server may count more than the client declared): all of
# them go. The lock is exclusive, so its description (and $fields) was this
# owner's too; an emptied hash is deleted.
_DROP_LOST_GRANT = Template("""
if tonumber(ARGV[6] or '0') ~= 0 and redis.call('get', KEYS[2]) == ARGV[7] then
    redis.call('hdel', KEYS[1], ARGV[1], '~holder', '~since', '~task'$fields)
end
""")


def drop_lost_grant(*fields: str) -> str:
    """The lost-grant removal; ``fields``: the kind's own hash fields that go with it."""
    return _DROP_LOST_GRANT.substitute(fields="".join(f", '{field}'" for field in fields))


# Expects $lost the number of the owner's holds its client declared lost
# (0 or absent: none), $key the owner's own hold key (a read hold, a
# semaphore's permits), $index the set naming the owners that have such a
# key, ARGV[1] owner id.
# The key is the owner's alone, so all of it goes, before the latch is read:
# the call is a new grant, never a report of holds its owner was told are gone.
_DROP_LOST_KEY = Template("""
if tonumber($lost or '0') ~= 0 then
    redis.call('del', $key)
    redis.call('srem', $index, ARGV[1])
end
""")


def drop_lost_key(*, key: str, index: str, lost: str = "ARGV[6]") -> str:
    """The removal of the owner's own hold ``key`` (and its place in ``index``) declared lost."""
    return _DROP_LOST_KEY.substitute(lost=lost, key=key, index=index)


# Expects KEYS[1] the lock hash, KEYS[$latch] the owner's request latch
# (optional), ARGV[1] owner id, ARGV[5] (with the latch) request id, `ttl` the
# expiry in ms. When the owner holds the lock, returns {$token, holds, pttl}:
# a resent call already granted (its latch holds its request id) changes
# nothing and reports the holds and PTTL now; else, after the kind's own
# $handoff step (which may return), one more hold, and the key's life is
# never shortened (a short lease inside a watchdog hold must not expire the
# outer hold); when it is lengthened, so is the fencing counter's
# ($renew_fence: none when the kind has none), as both expire together.
# Otherwise does nothing.
_REPORT_OR_REENTER = Template("""
if redis.call('hexists', KEYS[1], ARGV[1]) == 1 then
    if KEYS[$latch]
            and redis.call('set', KEYS[$latch], ARGV[5], 'px', $latch_ms, 'get') == ARGV[5] then
        return {$token, tonumber(redis.call('hget', KEYS[1], ARGV[1])), redis.call('pttl', KEYS[1])}
    end
${handoff}\
    local holds = redis.call('hincrby', KEYS[1], ARGV[1], 1)
    local left = redis.call('pttl', KEYS[1])
    if left < ttl then
        redis.call('pexpire', KEYS[1], ttl)
${renew_fence}\
        left = ttl
    end
    return {$token, holds, left}
end
""")


def report_or_reenter(*, latch: str, token: str, fence: str | None, handoff: str = "") -> str:
    """The resend report and the re-entry for KEYS[``latch``] and the Lua ``token`` expression.

    ``fence``: the counter key renewed with the hash (None: the kind has none);
    ``handoff``: a step of the kind's own between the report and the re-entry.
    """
    return _REPORT_OR_REENTER.substitute(
        latch=latch,
        latch_ms=REQUEST_LATCH_MS,
        token=token,
        handoff=handoff,
        renew_fence=f"        redis.call('pexpire', {fence}, ttl)\n" if fence else "",
    )


# Expects the lock free (inside the script's grant branch), KEYS[1] the lock
# hash, KEYS[2] its fencing counter, KEYS[$latch] the owner's request latch
# (optional), ARGV[1] owner id, ARGV[5] (with the latch) request id, ARGV[8]
# who asks ('' or absent: nobody said), `ttl` the expiry in ms.
# A new grant: the next token (next_token), one hold, the description
# stored as '~holder' and '~task' (store_holder) with the server's time in ms as '~since' (owner ids
# never start with '~', and the fields expire and go with the lock), the
# caller leaves the waiting set by the kind's own $leave step, the latch is
# set, the counter expires with the lock. Returns {token, 1, ttl}.
_NEW_GRANT = Template(
    next_token()
    + """
if ARGV[8] and ARGV[8] ~= '' then
    local since = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
"""
    + store_holder(
        key="KEYS[1]",
        fields="ARGV[1], 1, '~since', string.format('%.0f', since)",
        description="ARGV[8]",
        indent="    ",
    )
    + """else
    redis.call('hset', KEYS[1], ARGV[1], 1)
end
redis.call('pexpire', KEYS[1], ttl)
${leave}\
if KEYS[$latch] then
    redis.call('set', KEYS[$latch], ARGV[5], 'px', $latch_ms)
end
redis.call('set', KEYS[2], string.format('%.0f', token), 'px', ttl)
return {token, 1, ttl}
"""
)


#: The usual `$leave` step of :func:`new_grant`: a granted waiter (ARGV[3], ''
#: for none) leaves the waiting set KEYS[3].
LEAVE_WAITING_SET = """
if ARGV[3] ~= '' then
    redis.call('zrem', KEYS[3], ARGV[3])
end
"""


def new_grant(*, latch: str, leave: str = LEAVE_WAITING_SET) -> str:
    """A new grant with the request latch KEYS[``latch``]; ``leave`` takes the caller out."""
    return _NEW_GRANT.substitute(latch=latch, latch_ms=REQUEST_LATCH_MS, leave=leave.lstrip("\n"))


# Expects $wait: the ms the caller waits at most (the holder's PTTL; -1: no
# expiry), ARGV[3] waiter id ('' for an attempt that will not wait), ARGV[4]
# the longest the waiter will sleep, in ms, negated by a starving waiter (see
# HAND_OVER; only where the script has a $hand_over step, else ignored). A
# waiter is (re-)entered in the waiting set $waiters until just after its
# sleep ends (the sleep, cut to $wait, plus the margin that covers its own
# delay in re-registering), so a release can wake it; the set lives at least
# as long. Ends the script: returns $wait.
_REGISTER_WAITER = Template(
    """
if ARGV[3] ~= '' then
"""
    + NOW_MS_LUA
    + """
    local sleep = tonumber(ARGV[4])
    local starving = sleep < 0
    if starving then
        sleep = -sleep
    end
${hand_over}\
    if $wait >= 0 and $wait < sleep then
        sleep = $wait
    end
    local life = sleep + $margin_ms
    redis.call('zadd', $waiters, now + life, ARGV[3])
    if redis.call('pttl', $waiters) < life then
        redis.call('pexpire', $waiters, life)
    end
end
return $wait
"""
)


#: How long a waiter of the plain lock waits, in ms, before the holder's
#: release hands it the lock (HAND_OVER; Go's sync.Mutex: 1 ms).
STARVING_AFTER_MS = 5


# Defines `read_hand_over(entry)`: the parts of a waiter's '~w:<waiter id>'
# field (written by _ASK_HAND_OVER, read by HAND_OVER): its owner id, the
# life it asks for (ms), since when it waits (server ms; nil when unreadable)
# and its description ('' for none).
_READ_HAND_OVER = """\
local function read_hand_over(entry)
    local one = string.find(entry, '\\n', 1, true)
    local two = string.find(entry, '\\n', one + 1, true)
    local three = string.find(entry, '\\n', two + 1, true)
    return string.sub(entry, 1, one - 1), tonumber(string.sub(entry, one + 1, two - 1)),
        tonumber(string.sub(entry, two + 1, three - 1)), string.sub(entry, three + 1)
end
"""


# The plain lock's request to be handed the lock (register_waiter's
# $hand_over, in scripts.ACQUIRE: KEYS[1] the lock hash, held by another
# owner; ARGV[1] owner id, ARGV[2] expiry in ms, ARGV[3] waiter id, ARGV[8]
# holder description; `now`, and `starving`: the waiter says it starves).
# A waiter writes what a grant to it needs in the holder's hash, as the field
# '~w:<waiter id>': its owner id, the life it asks for, since when it waits
# (server ms: its first registration under this holder; 0 when it starves
# already) and its description. The field goes with the hash, so the
# holder's release (HAND_OVER) reads it and nothing is left behind. Only a
# waiter whose wake name begins with '@' (channels.WAKE_MARK) writes it: the
# release hands the lock to no other (a wake-only '&' waiter, a cluster's, or
# an older version's), so their field would be bytes and calls for nothing.
_ASK_HAND_OVER = """\
    if string.sub(ARGV[3], 1, 1) == '@' then
        local asked = '~w:' .. ARGV[3]
        local since = 0
        if not starving then
            since = now
            local before = redis.call('hget', KEYS[1], asked)
            if before then
                since = select(3, read_hand_over(before)) or now
            end
        end
        redis.call('hset', KEYS[1], asked, ARGV[1] .. '\\n' .. ARGV[2] .. '\\n'
                   .. string.format('%.0f', since) .. '\\n' .. ARGV[8])
    end
"""


def register_waiter(
    *, waiters: str = "KEYS[3]", wait: str = "pttl", hand_over: bool = False
) -> str:
    """Register the waiter in the set ``waiters`` for the local ``wait``, and return it.

    ``hand_over``: a starving waiter asks to be handed the lock (scripts.ACQUIRE).
    """
    return _REGISTER_WAITER.substitute(
        waiters=waiters,
        wait=wait,
        margin_ms=WAITER_MARGIN_MS,
        hand_over=textwrap.indent(_READ_HAND_OVER, "    ") + _ASK_HAND_OVER if hand_over else "",
    )


# Expects $hold the owner's hold hash, KEYS[$latch] its request latch
# (optional), ARGV[1] owner id, ARGV[3] (with the latch) request id.
# Returns -1 when the owner holds nothing (nothing is changed). A resent call
# that was already applied changes nothing and returns the owner's holds now
# (0 after a final release, even if another owner holds since). Otherwise
# takes one hold off and defines `holds`, the owner's holds left.
_RELEASE_HOLD = Template("""
if redis.call('hexists', $hold, ARGV[1]) == 0 then
    if KEYS[$latch] and redis.call('get', KEYS[$latch]) == ARGV[3] then
        return 0
    end
    return -1
end
if KEYS[$latch] and redis.call('set', KEYS[$latch], ARGV[3], 'px', $latch_ms, 'get') == ARGV[3] then
    return tonumber(redis.call('hget', $hold, ARGV[1]))
end
local holds = redis.call('hincrby', $hold, ARGV[1], -1)
""")


def release_hold(*, hold: str = "KEYS[1]", latch: str) -> str:
    """Take one of the owner's holds off ``hold``, idempotently with the latch KEYS[``latch``]."""
    return _RELEASE_HOLD.substitute(hold=hold, latch=latch, latch_ms=REQUEST_LATCH_MS)


def release_one(*, latch: str) -> str:
    """:func:`release_hold` on KEYS[1], returning the holds left; at 0, KEYS[1] is deleted.

    What follows is the kind's full-release step (who to wake).
    """
    return (
        release_hold(latch=latch)
        + """if holds > 0 then
    return holds
end
redis.call('del', KEYS[1])
"""
    )


# Expects $waiters the waiting set, $channel the release channel, ARGV[2] the
# publish command. After a release that freed the lock: with no registered
# waiter left (expired registrations are dropped), nothing is published (a
# PUBLISH costs the server a channel lookup on every uncontended release);
# else the release is published ($publish), naming the waiter whose sleep
# ends first on its wake channel (publish_to_waiter) or, for everyone, with an
# empty message on the shared channel that wakes every waiter.
# Ends the script: returns 0.
_WAKE_AFTER_RELEASE = Template(
    """
if redis.call('exists', $waiters) == 0 then
    return 0
end
"""
    + NOW_MS_LUA
    + """
redis.call('zremrangebyscore', $waiters, '-inf', now)
${publish}\
return 0
"""
)


# Expects $waiter a waiting-set entry (a waiter id, core/_protocol/channels.py),
# $message what to publish (naming that waiter first), $channel the lock's
# release channel, $publish the publish command. An id "<wake name>:<n>" whose
# wake name begins with '@' names its listener's wake channel for this lock,
# "<channel>:<wake name>": the message goes there, so only the process of that
# waiter reads it. The channel is made here from $channel, whose hash tag comes
# first, so it is in the lock's slot (SPUBLISH on a cluster reaches the node
# the waiter's SSUBSCRIBE is on). An id of an older version (no wake name) gets
# it on the shared channel, which every waiter listens to.
_PUBLISH_TO_WAITER = Template("""local wake = string.match($waiter, '^([@&][^:]*):')
if wake then
    redis.call($publish, $channel .. ':' .. wake, $message)
else
    redis.call($publish, $channel, $message)
end
""")


def publish_to_waiter(
    *,
    waiter: str,
    channel: str,
    publish: str = "ARGV[2]",
    message: str | None = None,
    indent: str = "",
) -> str:
    """Publish ``message`` (default: the id) to the waiter whose id is the Lua ``waiter``.

    Defines the Lua local ``wake``. ``channel`` is the lock's release channel;
    ``indent`` goes before each line (the block's place in its script).
    """
    lua = _PUBLISH_TO_WAITER.substitute(
        waiter=waiter, channel=channel, publish=publish, message=message or waiter
    )
    return textwrap.indent(lua, indent)


_PUBLISH_FIRST = Template(
    """local first = redis.call('zrange', $waiters, 0, 0)[1]
if first then
"""
    + publish_to_waiter(waiter="first", channel="$channel", indent="    ")
    + """end
"""
)


_PUBLISH_EVERYONE = Template("""if redis.call('zcard', $waiters) > 0 then
    redis.call(ARGV[2], $channel, '')
end
""")


def wake_after_release(*, waiters: str, channel: str, everyone: bool = False) -> str:
    """Wake the first registered waiter in ``waiters`` on ``channel`` (or ``everyone``)."""
    publish = (_PUBLISH_EVERYONE if everyone else _PUBLISH_FIRST).substitute(
        waiters=waiters, channel=channel
    )
    return _WAKE_AFTER_RELEASE.substitute(waiters=waiters, publish=publish)


# KEYS[1] the lock hash (still there), KEYS[2] its release channel, KEYS[3]
# its waiting set, ARGV[2] the publish command; after the owner's last hold
# went (scripts.RELEASE), with $last the released grant's token. The plain
# lock's full release: the lock is freed, and the registered waiter whose sleep
# ends first (expired registrations dropped) is woken on its wake channel
# (publish_to_waiter) or, when it is *starving* (register_waiter's
# '~w:<waiter id>' field of the hash says it starves, or has waited
# STARVING_AFTER_MS under this holder) and has a wake name, handed the lock:
# a new grant to its owner in the release itself (the next token after $last,
# next_token's rule, kept in the hash's $token_field), for the life it asked
# for, with its description, marked '~handoff' = its waiter id, the waiter out
# of the set. The message on its wake channel is "<waiter id> <token>"; its
# waiter holds when it reads it, with no acquire call (or, when it does not
# take it, its next attempt confirms it: scripts.ACQUIRE). The grant is made
# only if this server has a subscriber on that wake channel (PUBSUB NUMSUB;
# never with SPUBLISH: a cluster's waiters are wake-only), asked *before*
# anything is published (an ACL user without +pubsub|numsub, as the minimal
# ACL was before it, gets no hand-over, only wake-ups): a waiter
# whose process is gone (its connection, hence its subscription, closed with
# it) is not handed the lock; it leaves the set, and the next waiter is woken
# instead. A message naming a token is never published for a grant that does
# not stand: the publish also reaches subscribers this count cannot see (a
# replica's, through replication: a listener left on a demoted master, or
# reconnected by a sentinel that had not heard of the failover yet), and one
# of them would hold a lock nobody granted. Such a waiter gets a plain wake-up
# (its id) and retries. Nor does a pattern subscriber count as the waiter.
# With no waiter, nothing is published. Ends the script: returns 0.
_HAND_OVER = Template(
    """if redis.call('exists', KEYS[3]) == 0 then
    redis.call('del', KEYS[1])
    return 0
end
"""
    + NOW_MS_LUA
    + _READ_HAND_OVER
    + """redis.call('zremrangebyscore', KEYS[3], '-inf', now)
local first = redis.call('zrange', KEYS[3], 0, 0)[1]
local entry = first and redis.call('hget', KEYS[1], '~w:' .. first)
redis.call('del', KEYS[1])
if not first then
    return 0
end
local starving = entry and string.match(first, '^(@[^:]*):')
local owner, life, since, holder
if starving then
    owner, life, since, holder = read_hand_over(entry)
    if now - since < $starving_after_ms then
        starving = nil
    end
end
local heard = starving and ARGV[2] == 'publish'
        and redis.pcall('pubsub', 'numsub', KEYS[2] .. ':' .. starving)
if starving and (not heard or heard.err or heard[2] == 0) then
    redis.call('zrem', KEYS[3], first)
    redis.call(ARGV[2], KEYS[2] .. ':' .. starving, first)
    first = redis.call('zrange', KEYS[3], 0, 0)[1]
    if not first then
        return 0
    end
    starving = nil
end
if starving then
    local token = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    local last = tonumber($last or '0') or 0
    if token <= last then
        token = last + 1
    end
    local fence = string.format('%.0f', token)
    if holder ~= '' then
"""
    + store_holder(
        key="KEYS[1]",
        fields="owner, 1, '$token_field', fence, '~since', string.format('%.0f', now), "
        "'~handoff', first",
        description="holder",
        indent="        ",
    )
    + """    else
        redis.call('hset', KEYS[1], owner, 1, '$token_field', fence, '~handoff', first)
    end
    redis.call('pexpire', KEYS[1], life)
    redis.call('zrem', KEYS[3], first)
    redis.call(ARGV[2], KEYS[2] .. ':' .. starving, first .. ' ' .. fence)
    return 0
end
"""
    + publish_to_waiter(waiter="first", channel="KEYS[2]")
    + """return 0
"""
)


def release_and_hand_over(*, last: str, token_field: str) -> str:
    """The plain lock's full release, its hash still there: wake or hand over (_HAND_OVER).

    ``last``: the released grant's token, a Lua expression; ``token_field``:
    the hash's field a handed grant's token goes to.
    """
    return _HAND_OVER.substitute(
        starving_after_ms=STARVING_AFTER_MS, last=last, token_field=token_field
    )


# A step between a resent call's report and a re-entry (report_or_reenter's
# $handoff; expects `ttl`, KEYS[1] lock hash, KEYS[2] fencing counter, ARGV[3]
# waiter or queue id): a lock handed to the caller (the hash's '~handoff' is
# its id) whose message it did not take is confirmed as a *new* grant, with
# the caller's own expiry: {token, 1, ttl}. Any other call of the owner finds
# the marker done and clears it.
CONFIRM_HANDOFF = Template("""
    local handed = redis.call('hget', KEYS[1], '~handoff')
    if handed then
        redis.call('hdel', KEYS[1], '~handoff')
        if handed == ARGV[3] then
            redis.call('pexpire', KEYS[1], ttl)
            redis.call('pexpire', KEYS[2], ttl)
            return {$current_token, 1, ttl}
        end
    end
""").substitute(current_token=CURRENT_TOKEN)
