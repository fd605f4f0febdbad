"""The read-write lock's keys, Lua scripts and script calls (no I/O).

Many readers or one writer, each reentrant per owner. The keys of one name
share its hash tag (so one cluster slot), and a ``:rw:`` infix keeps them
apart from a plain lock of the same name::

    <base>:rw:write            HASH    writer's owner id -> hold count (+ ~holder, ~task, ~since)
    <base>:rw:fence            STRING  last write token granted
    <base>:rw:reader:<owner>   HASH    owner id -> read holds (+ ~holder, ~task, ~since), per reader
    <base>:rw:readers          SET     the owner ids that may hold a read key (the index)
    <base>:rw:waiters          ZSET    waiter id -> expiry (ms): readers and writers alike
    <base>:rw:released         CHANNEL wake-ups
    <base>:rw:write:req:<owner>, <base>:rw:read:req:<owner>  the request latches

``<base>`` is the plain lock's hash key (``<prefix>:{<escaped name>}``).

Each reader counts its holds in a key of its own, so the watchdog renews a read
hold exactly as it renews a lock (scripts.RENEW on the reader's key, with a
"fence" key that is never written: renewing it is a no-op), and a reader that
dies stops being renewed: its key expires within the watchdog timeout (or its
lease), and the next script that looks drops it from the index.

The index rule. A writer finds the readers through the index, so the index
must never vanish while a reader lives, whatever the reader's lease: it has
no expiry at all. It cannot grow without bound either: a reader leaves it on
its final release, and every final read release and every write attempt that
finds no writer prunes it of the members whose read key has expired (dead
readers). So it holds the live readers plus those that died since the last
such script ran, and Redis deletes it when its last member goes. A name never
used again after a reader died keeps that small SET until its next use.

Wake-ups. Readers wait only for a writer; writers wait for a writer or for the
readers. A writer's final release frees everyone who waits, so it wakes every
waiter at once (an empty message): the readers all get in together, and the
writers race (the losers register again and sleep). Waking one reader there
would strand the others until their PTTL. The last reader's release frees
writers only (no reader waits while no writer holds), so it wakes one
registered waiter by name, as a lock's release does; the others wait for that
one's release. A reader whose key expired wakes nobody: a writer waiting on
readers sleeps at most the *shortest* reader's PTTL (the first moment one may
vanish) and looks again, so a dead reader delays it by at most the watchdog
timeout. Readers are never held back while a writer waits: a steady stream of
overlapping readers can starve a writer (a documented limit).

How the scripts are composed: from the shared rules of
:mod:`~django_rlock.core._protocol.lua` (each a function whose keyword
arguments name the keys it works on, e.g. ``new_grant(latch="6")``) and the
read-write lock's own Lua; where that names a value of its own
(``$latch_ms``, ``$upgrade_refused``), the script is a
:class:`string.Template` filled by name with ``substitute``.
"""

from __future__ import annotations

from dataclasses import dataclass
from string import Template
from typing import Any, ClassVar, Unpack

from django_rlock.core._process import lostholds
from django_rlock.core._process.holder import describe
from django_rlock.core._protocol.calls import ScriptCall, acquire_args, attempt_args
from django_rlock.core._protocol.deadlocks import READ, WRITE, Wait
from django_rlock.core._protocol.lock import (
    ABANDON,
    FORCE_RELEASE,
    KindScripts,
    LockOptions,
    MakeScript,
    ScriptSet,
)
from django_rlock.core._protocol.lockbase import LockBase
from django_rlock.core._protocol.lua import (
    CURRENT_TOKEN,
    LEAVE_WAITING_SET,
    NOW_MS_LUA,
    REQUEST_LATCH_MS,
    drop_lost_grant,
    drop_lost_key,
    new_grant,
    register_waiter,
    release_one,
    report_or_reenter,
    store_holder,
    wake_after_release,
)
from django_rlock.core._protocol.names import LockKeys
from django_rlock.core.exceptions import LockUpgradeError

#: What WRITE_ACQUIRE answers an owner that holds a read but not the write.
UPGRADE_REFUSED = "upgrade"


# KEYS[1] the owner's read key, KEYS[2] write hash, KEYS[3] waiting set,
# KEYS[4] readers index, KEYS[5] (optional) the owner's read request latch
# ARGV[1] owner id, ARGV[2] expiry in ms, ARGV[3] waiter id ('' for none),
# ARGV[4] the longest the waiter will sleep (ms), ARGV[5] (with KEYS[5]) request id,
# ARGV[6] the owner's read holds its client has declared lost (0: none),
# ARGV[7] who asks, for operators and the deadlock detector ('' for none)
# Returns {0, holds, pttl} when granted (a read hold has no fencing token: 0),
#   pttl being the read key's life left in ms; granted unless another owner
#   holds the write (the writer may read). A re-entry never shortens the key.
#   A resent call already granted reports the holds now (request latch).
#   Read holds declared lost are taken off first: they are the owner's alone,
#   so the call is a new grant.
# Returns the writer's PTTL in ms (-1: no expiry) when another owner writes;
#   a waiter is then entered in the waiting set.
READ_ACQUIRE = Template(
    """
local ttl = tonumber(ARGV[2])
"""
    + drop_lost_key(key="KEYS[1]", index="KEYS[4]")
    + report_or_reenter(latch="5", token="0", fence=None)
    + """
if redis.call('exists', KEYS[2]) == 1 and redis.call('hexists', KEYS[2], ARGV[1]) == 0 then
    local pttl = redis.call('pttl', KEYS[2])
"""
    + register_waiter()
    + """
end
redis.call('hset', KEYS[1], ARGV[1], 1)
if ARGV[7] ~= '' then
"""
    + NOW_MS_LUA
    + """
"""
    + store_holder(
        key="KEYS[1]",
        fields="'~since', string.format('%.0f', now)",
        description="ARGV[7]",
        indent="    ",
    )
    + """\
end
redis.call('pexpire', KEYS[1], ttl)
redis.call('sadd', KEYS[4], ARGV[1])
"""
    + LEAVE_WAITING_SET
    + """
if KEYS[5] then
    redis.call('set', KEYS[5], ARGV[5], 'px', $latch_ms)
end
return {0, 1, ttl}
"""
).substitute(latch_ms=REQUEST_LATCH_MS)


# KEYS[1] write hash, KEYS[2] fencing counter, KEYS[3] waiting set,
# KEYS[4] readers index, KEYS[5] the owner's read key,
# KEYS[6] (optional) the owner's write request latch
# ARGV[1..8] as scripts.ACQUIRE (owner, expiry ms, waiter id, sleep ms,
#   request id, lost holds, their token, holder description),
# ARGV[9] the read keys' common prefix ('<base>:rw:reader:'),
# ARGV[10] 1 when the owner's read holds were declared lost by its client (0: none)
# Returns {token, holds, pttl} when granted, exactly as scripts.ACQUIRE: a new
#   grant's token is max(last + 1, the server's clock in microseconds), the
#   counter expires with the write hash, a re-entry keeps the token and never
#   shortens the key, a resend reports, lost holds go first.
# Returns UPGRADE_REFUSED ('upgrade') when the owner holds a read but not the
#   write: waiting would deadlock (the owner's own read keeps the write from
#   it), so the caller is told at once, and nothing changes. A read its client
#   declared lost (ARGV[10]) is the owner's no more: its key, which may live on
#   until it expires, is taken off first (as lost holds are), so the owner
#   is not told to release what it has given up.
# Returns the PTTL in ms to wait at most when busy: the other writer's, or,
#   when readers hold, the shortest-lived reader's (the first that may vanish
#   without a release; see the module's docstring). The index is pruned of
#   dead readers on the way. A waiter is then entered in the waiting set.
WRITE_ACQUIRE = Template(
    """
local ttl = tonumber(ARGV[2])
"""
    + drop_lost_grant()
    + report_or_reenter(latch="6", token=CURRENT_TOKEN, fence="KEYS[2]")
    + drop_lost_key(key="KEYS[5]", index="KEYS[4]", lost="ARGV[10]")
    + """
if redis.call('hexists', KEYS[5], ARGV[1]) == 1 then
    return '$upgrade_refused'
end
local pttl = -2
if redis.call('exists', KEYS[1]) == 1 then
    pttl = redis.call('pttl', KEYS[1])
else
    for _, reader in ipairs(redis.call('smembers', KEYS[4])) do
        local left = redis.call('pttl', ARGV[9] .. reader)
        if left == -2 then
            redis.call('srem', KEYS[4], reader)
        elseif pttl == -2 or (left >= 0 and (pttl < 0 or left < pttl)) then
            pttl = left
        end
    end
end
if pttl == -2 then
"""
    + new_grant(latch="6")
    + """
end
"""
    + register_waiter()
).substitute(upgrade_refused=UPGRADE_REFUSED)


# KEYS[1] write hash, KEYS[2] channel, KEYS[3] waiting set,
# KEYS[4] (optional) the owner's write request latch
# ARGV[1] owner id, ARGV[2] publish command, ARGV[3] (with KEYS[4]) request id
# Returns as scripts.RELEASE. The writer's final release frees every waiter
#   (readers all at once, writers to race), so while any registration is live
#   it publishes an empty message: every waiter wakes.
WRITE_RELEASE = release_one(latch="4") + wake_after_release(
    waiters="KEYS[3]", channel="KEYS[2]", everyone=True
)


# KEYS[1] the owner's read key, KEYS[2] readers index, KEYS[3] write hash,
# KEYS[4] channel, KEYS[5] waiting set, KEYS[6] (optional) the owner's read latch
# ARGV[1] owner id, ARGV[2] publish command, ARGV[3] (with KEYS[6]) request id,
# ARGV[4] the read keys' common prefix
# Returns as scripts.RELEASE. A final release leaves the index and prunes it
#   of dead readers; when no reader is left and nobody writes, the lock is
#   free for a writer: the registered waiter whose sleep ends first is woken
#   by name (see the module's docstring for why one is enough).
READ_RELEASE = (
    release_one(latch="6")
    + """
redis.call('srem', KEYS[2], ARGV[1])
for _, reader in ipairs(redis.call('smembers', KEYS[2])) do
    if redis.call('exists', ARGV[4] .. reader) == 0 then
        redis.call('srem', KEYS[2], reader)
    end
end
if redis.call('exists', KEYS[2]) == 1 or redis.call('exists', KEYS[3]) == 1 then
    return 0
end
"""
    + wake_after_release(waiters="KEYS[5]", channel="KEYS[4]")
)


# KEYS[1] write hash, KEYS[2] channel, KEYS[3] waiting set
# ARGV[1] waiter id, ARGV[2] publish command
# A waiter leaves without the lock. When nobody writes, a release may have
#   woken this waiter alone (the last reader's): wake the others instead.
# Returns 1 when the others were woken, else 0. The write hash stands where a
#   lock's hash does, so this is scripts.ABANDON.
RW_ABANDON = ABANDON


# KEYS[1] write hash, KEYS[2] channel
# ARGV[1] publish command
# Returns 1 when a write hold was deleted (every waiter is woken), else 0:
#   the write hold is a lock hash, so this is scripts.FORCE_RELEASE.
WRITE_FORCE_RELEASE = FORCE_RELEASE


# KEYS[1] readers index, KEYS[2] channel
# ARGV[1] publish command, ARGV[2] the read keys' common prefix
# Deletes every reader's hold, O(readers). Returns how many read keys were
#   deleted; when any, every waiter is woken.
READ_FORCE_RELEASE = """
local deleted = 0
for _, reader in ipairs(redis.call('smembers', KEYS[1])) do
    deleted = deleted + redis.call('del', ARGV[2] .. reader)
end
redis.call('del', KEYS[1])
if deleted > 0 then
    redis.call(ARGV[1], KEYS[2], '')
end
return deleted
"""


# KEYS[1] readers index
# ARGV[1] the read keys' common prefix
# Read-only. Returns {live readers, the longest-lived one's PTTL in ms}
#   ({0, -2} when no reader lives; -1: a key with no expiry).
READERS = """
local live, longest = 0, -2
for _, reader in ipairs(redis.call('smembers', KEYS[1])) do
    local left = redis.call('pttl', ARGV[1] .. reader)
    if left ~= -2 then
        live = live + 1
        if longest ~= -1 and (left == -1 or left > longest) then
            longest = left
        end
    end
end
return {live, longest}
"""


@dataclass(frozen=True, slots=True)
class RWKeys:
    """The Redis keys and channel of one read-write lock name (see the module's docstring)."""

    name: str
    #: The prefix of every key: ``<base>:rw``.
    base: str
    write: str
    fence: str
    readers: str
    reader_prefix: str
    waiters: str
    channel: str
    #: The key a read hold's renewal treats as its fence: never written.
    no_fence: str

    @classmethod
    def build(cls, prefix: str, name: str) -> RWKeys:
        """Derive the keys of ``name`` under ``prefix`` (both already checked)."""
        base = f"{LockKeys.build(prefix, name).hash}:rw"
        return cls(
            name=name,
            base=base,
            write=f"{base}:write",
            fence=f"{base}:fence",
            readers=f"{base}:readers",
            reader_prefix=f"{base}:reader:",
            waiters=f"{base}:waiters",
            channel=f"{base}:released",
            no_fence=f"{base}:nofence",
        )

    def reader(self, owner: str) -> str:
        """The key counting ``owner``'s read holds."""
        return f"{self.reader_prefix}{owner}"

    def for_write(self) -> LockKeys:
        """The write side as a lock's keys: its hash, fence, waiters and channel."""
        return LockKeys(self.name, self.write, self.fence, self.waiters, self.channel)

    def for_read(self) -> LockKeys:
        """The read side as a lock's keys; its ``hash`` only names the read latches.

        A read hold's key is per owner (:meth:`reader`).
        """
        return LockKeys(self.name, f"{self.base}:read", self.no_fence, self.waiters, self.channel)


def read_acquire_call(
    keys: RWKeys,
    owner: str,
    *,
    ttl: float,
    waiter_id: str,
    sleep: float,
    rid: str,
    latch: str,
    lost: bool,
    holder: str = "",
) -> ScriptCall:
    """One read acquire (READ_ACQUIRE): ``ttl`` seconds of life, ``sleep`` the longest wait.

    ``holder``: who asks (core/holder.py), kept with a new read hold.
    """
    attempt = attempt_args(owner, ttl=ttl, waiter_id=waiter_id, sleep=sleep, rid=rid)
    return ScriptCall(
        keys=[keys.reader(owner), keys.write, keys.waiters, keys.readers, latch],
        args=[*attempt, int(lost), holder],
        rid=rid,
    )


def write_acquire_call(
    keys: RWKeys,
    owner: str,
    *,
    ttl: float,
    waiter_id: str,
    sleep: float,
    rid: str,
    latch: str,
    lost: tuple[int, int] | None,
    holder: str,
    read_lost: bool = False,
) -> ScriptCall:
    """One write acquire (WRITE_ACQUIRE); ``lost``: (token, holds) declared lost, as for a lock.

    ``read_lost``: the owner's read holds were declared lost (taken off first).
    """
    like_a_lock = acquire_args(
        owner, ttl=ttl, waiter_id=waiter_id, sleep=sleep, rid=rid, lost=lost, holder=holder
    )
    return ScriptCall(
        keys=[keys.write, keys.fence, keys.waiters, keys.readers, keys.reader(owner), latch],
        args=[*like_a_lock, keys.reader_prefix, 1 if read_lost else 0],
        rid=rid,
    )


def write_release_call(keys: RWKeys, owner: str, publish: str, rid: str, latch: str) -> ScriptCall:
    """One release of one write hold (WRITE_RELEASE)."""
    return ScriptCall(
        keys=[keys.write, keys.channel, keys.waiters, latch], args=[owner, publish, rid], rid=rid
    )


def read_release_call(keys: RWKeys, owner: str, publish: str, rid: str, latch: str) -> ScriptCall:
    """One release of one read hold (READ_RELEASE)."""
    return ScriptCall(
        keys=[keys.reader(owner), keys.readers, keys.write, keys.channel, keys.waiters, latch],
        args=[owner, publish, rid, keys.reader_prefix],
        rid=rid,
    )


def rw_abandon_call(keys: RWKeys, waiter_id: str, publish: str) -> ScriptCall:
    """A waiter leaves without the lock (RW_ABANDON)."""
    return ScriptCall(keys=[keys.write, keys.channel, keys.waiters], args=[waiter_id, publish])


def write_force_release_call(keys: RWKeys, publish: str) -> ScriptCall:
    """Delete the write hold whoever has it (WRITE_FORCE_RELEASE)."""
    return ScriptCall(keys=[keys.write, keys.channel], args=[publish])


def read_force_release_call(keys: RWKeys, publish: str) -> ScriptCall:
    """Delete every read hold (READ_FORCE_RELEASE)."""
    return ScriptCall(keys=[keys.readers, keys.channel], args=[publish, keys.reader_prefix])


def readers_call(keys: RWKeys) -> ScriptCall:
    """Count the live readers and find the longest-lived one's PTTL (READERS)."""
    return ScriptCall(keys=[keys.readers], args=[keys.reader_prefix])


class RWScripts(ScriptSet):
    """The read-write lock's scripts: acquires stay plain, giving back runs under OOM.

    See :class:`~django_rlock.core._protocol.lock.ScriptSet`.
    """

    def register(self, plain: MakeScript, oom_safe: MakeScript) -> None:
        """Make the read-write lock's scripts."""
        self.read_acquire = plain(READ_ACQUIRE)
        self.write_acquire = plain(WRITE_ACQUIRE)
        self.read_release = oom_safe(READ_RELEASE)
        self.write_release = oom_safe(WRITE_RELEASE)
        self.abandon = oom_safe(RW_ABANDON)
        self.read_force_release = oom_safe(READ_FORCE_RELEASE)
        self.write_force_release = oom_safe(WRITE_FORCE_RELEASE)
        self.readers = plain(READERS)

    def side(self, mode: str) -> KindScripts:
        """The row of the ``READ`` or the ``WRITE`` side (see :class:`~.lock.KindScripts`)."""
        if mode == READ:
            return KindScripts(
                self.read_acquire, self.read_release, self.abandon, self.read_force_release
            )
        return KindScripts(
            self.write_acquire, self.write_release, self.abandon, self.write_force_release
        )


def check_rw_client(min_replicas: int, name: str) -> None:
    """Refuse (ValueError) a read-write lock on a client that syncs grants to replicas."""
    if min_replicas:
        raise ValueError(
            f"read_write_lock({name!r}): a read-write lock cannot wait for replicas "
            f"(this client has min_replicas={min_replicas}); use a client "
            "built without min_replicas"
        )


class _Side(LockBase):
    """What both sides of both engines share, without I/O: the keys, scripts and calls.

    Put before the engine's lock class (``class WriteLock(WriteSide, RLock)``):
    that class's acquire, release, waiting, ``force_release`` and ``with`` then
    send this side's scripts through the sender hooks.
    """

    kind = "read_write_lock"  # its factory, named when a client's layout refuses it

    #: Which side: ``READ`` or ``WRITE`` (its row of scripts, its wait edges' word).
    _mode: ClassVar[str]

    def _description_key(self) -> str | None:
        return None  # busy by readers or by a writer: no one hold says which

    rw_keys: RWKeys

    def __init__(
        self, client: Any, keys: RWKeys, scripts: RWScripts, **options: Unpack[LockOptions]
    ) -> None:
        # `client` is the engine's (LockClient or AsyncLockClient): the lock
        # class after this one in the MRO takes it and finds the engine.
        super().__init__(client, keys.name, **options)
        self.rw_keys = keys
        self.keys = self._side_keys(keys)
        self._scripts = scripts
        self._side_scripts = scripts.side(self._mode)

    def __repr__(self) -> str:
        # The class names the side and the engine: WriteLock, AsyncReadLock...
        return f"<{type(self).__name__} {self.name!r}>"

    def _side_keys(self, keys: RWKeys) -> LockKeys:
        """The keys this side's holds are counted and waited on under."""
        raise NotImplementedError

    def _kind_scripts(self) -> KindScripts:
        return self._side_scripts

    def _deadlock_wait(self) -> Wait:
        return Wait(self._mode, self.rw_keys.base)

    def _abandon_call(self, waiter_id: str) -> ScriptCall:
        return rw_abandon_call(self.rw_keys, waiter_id, self._engine.publish_command)


class WriteSide(_Side):
    """The write side's keys, calls and scripts (:class:`WriteLock`, ``AsyncWriteLock``)."""

    _mode = WRITE

    def _side_keys(self, keys: RWKeys) -> LockKeys:
        return keys.for_write()

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        return write_acquire_call(
            self.rw_keys,
            owner,
            ttl=self._ttl_of(lease),
            waiter_id=waiter_id,
            sleep=sleep,
            rid=self._request_id("acquire", owner),
            latch=self.keys.latch(owner),
            lost=lostholds.lost_on_server(self.keys.hash, owner),
            holder=describe(lease),
            read_lost=lostholds.lost_on_server(self.rw_keys.reader(owner), owner) is not None,
        )

    def _acquire_reply(
        self,
        reply: Any,
        owner: str,
        lease: float | None,
        sent_at: float,
        requested_at: float | None = None,
    ) -> float | None:
        if isinstance(reply, bytes):
            reply = reply.decode()
        if reply == UPGRADE_REFUSED:
            raise LockUpgradeError(
                f"cannot take the write lock of {self.name!r}: the caller holds its read "
                "lock, and waiting would never end (its own read hold keeps the write "
                "lock from it); release every read hold first, or take the write lock "
                "before reading (the writer may also read)",
                name=self.name,
            )
        return super()._acquire_reply(reply, owner, lease, sent_at, requested_at)

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        publish = self._engine.publish_command
        return write_release_call(self.rw_keys, owner, publish, rid, self.keys.latch(owner))

    def _force_release_call(self) -> ScriptCall:
        return write_force_release_call(self.rw_keys, self._engine.publish_command)


class ReadSide(_Side):
    """The read side's keys, calls and scripts (:class:`ReadLock`, ``AsyncReadLock``)."""

    _mode = READ

    def _side_keys(self, keys: RWKeys) -> LockKeys:
        return keys.for_read()

    def hold_keys(self, owner: str) -> tuple[str, str]:
        """The owner's own read key, and a key never written (a read has no fencing counter)."""
        return self.rw_keys.reader(owner), self.rw_keys.no_fence

    def _acquire_call(
        self, owner: str, lease: float | None, waiter_id: str, sleep: float
    ) -> ScriptCall:
        key = self.rw_keys.reader(owner)
        return read_acquire_call(
            self.rw_keys,
            owner,
            ttl=self._ttl_of(lease),
            waiter_id=waiter_id,
            sleep=sleep,
            rid=self._request_id("acquire", owner),
            latch=self.keys.latch(owner),
            lost=lostholds.lost_on_server(key, owner) is not None,
            holder=describe(),
        )

    def _release_call(self, owner: str) -> ScriptCall:
        rid = self._request_id("release", owner)
        publish = self._engine.publish_command
        return read_release_call(self.rw_keys, owner, publish, rid, self.keys.latch(owner))

    def _force_release_call(self) -> ScriptCall:
        return read_force_release_call(self.rw_keys, self._engine.publish_command)

    def _readers_call(self) -> ScriptCall:
        return readers_call(self.rw_keys)


class ReadWriteBase:
    """What :class:`ReadWriteLock` and the asyncio ``AsyncReadWriteLock`` share: keys and name."""

    keys: RWKeys

    def _build_keys(self, min_replicas: int, key_prefix: str, name: str) -> RWKeys:
        """The pair's keys, once the client is known to suit a read-write lock."""
        check_rw_client(min_replicas, name)
        self.keys = RWKeys.build(key_prefix, name)
        return self.keys

    @property
    def name(self) -> str:
        """The lock's name, as the caller gave it."""
        return self.keys.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
