"""The state of a release listener's pub/sub channels, without I/O.

Both listeners (:mod:`django_rlock.core._sync.waiting`, threads, and
:mod:`django_rlock.core._aio.waiting`, asyncio) keep their channels in a
:class:`ChannelTable` and only move bytes: the table decides what to
(un)subscribe, when a subscription counts as confirmed, whom a message wakes,
and what a failed read means. The sync listener calls it with its lock held;
the asyncio one from its event loop.

Channels are reference-counted: the first waiter on a lock subscribes, the
last one to leave unsubscribes. Subscriptions are confirmed by counting
SUBSCRIBE commands ``sent`` against confirmations ``acked`` per channel; a
channel's state outlives its waiters until every confirmation has arrived, so
a late confirmation of an old subscription can never pass for a new one.

Wake channels. A waiter listens on two channels of its lock: the lock's
shared release channel and its listener's own *wake channel* for that lock,
``<release channel>:<wake name>``. Its waiter id, ``<wake name>:<n>``, is
what its attempts enter in the lock's waiting set, so the entry names the
channel: a release that wakes that waiter publishes there (the release script
derives the channel from the entry, :func:`~django_rlock.core._protocol.lua.publish_to_waiter`),
and only the one process whose waiter it names reads the message, not every
process waiting on the lock. A wake name begins with :data:`WAKE_MARK`; the
waiter ids of older versions (no mark) get their message on the shared
channel, which every waiter still listens to, as do the messages of older
versions' releases and the empty message that wakes everyone: old and new
processes wake each other during a rolling upgrade. A release may also hand
the lock to a starving waiter whose wake name begins with :data:`WAKE_MARK`
(``lua._HAND_OVER``), when the server counts a subscriber on the waiter's
wake channel (asked before the message goes out, so a waiter the count leaves
out, on a replica, hears a plain wake-up, never a grant that does not stand).
A cluster's listener names its waiters with :data:`WAKE_ONLY_MARK`: woken on
their wake channel, never handed a lock (a node counts its own subscribers,
while a PUBLISH before Redis 7 reaches every node and an SPUBLISH the shard's
replicas, where a waiter may still be subscribed while its slot fails over).
The wake channel follows the release channel's hash tag, so on a cluster both
are in the lock's slot and one SSUBSCRIBE on the node owning it takes both.

A refused (S)SUBSCRIBE (an ACL that allows PUBLISH but not SUBSCRIBE, a slot
that moved) leaves the connection sound: reconnecting would be refused again.
The refusal answers the pending subscriptions instead, so their waiters stop
waiting for a confirmation and retry; it is logged once per listener.

On a cluster a node also drops sharded subscriptions on its own: when the
channel's slot leaves it (a reshard, a failover) it sends an unasked
SUNSUBSCRIBE, and it refuses a new SSUBSCRIBE for that slot with MOVED. The
table marks such a channel :attr:`Channel.gone` and wakes its waiters: a
plain listener's waiters then wait out the holder's PTTL, a cluster's
sharded listener (:mod:`django_rlock.core._sync.sharding`) subscribes them
again on the slot's new owner. A gone channel is not subscribed on this
connection: leaving it sends no UNSUBSCRIBE (the node would refuse it too),
and a waiter that joins it subscribes anew.
"""

from __future__ import annotations

import enum
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from redis.crc import key_slot
from redis.exceptions import MovedError, ResponseError

#: The first character of a wake name (see the module's docstring). Older
#: versions' listener ids are hex digits, so no id of theirs starts with it.
WAKE_MARK = "@"


#: The first character of a wake name whose waiters are never handed a lock.
WAKE_ONLY_MARK = "&"


def new_wake_name(*, hand_over: bool = True) -> str:
    """A new listener's wake name: the prefix of its waiter ids, and of its wake channels.

    ``hand_over=False``: its waiters are woken on their wake channel but
    never handed a lock (see the module's docstring).
    """
    return (WAKE_MARK if hand_over else WAKE_ONLY_MARK) + secrets.token_hex(8)


def listen_channels(channel: bytes, waiter_id: str) -> tuple[bytes, ...]:
    """The channels a waiter ``waiter_id`` of the lock with release ``channel`` listens on.

    The shared channel, then, for a waiter id with a wake name, its wake
    channel: ``<channel>:<wake name>``, which the release script derives from
    the waiting-set entry (the id) in the same way.
    """
    if not waiter_id.startswith((WAKE_MARK, WAKE_ONLY_MARK)):
        return (channel,)
    wake_name = waiter_id.rpartition(":")[0]
    return (channel, channel + b":" + wake_name.encode())


class Waiter(Protocol):
    """A waiter as the table sees it: its id, and how to wake it."""

    @property
    def waiter_id(self) -> str:
        """Unique per waiter; a release message naming it wakes this waiter alone."""

    def wake(self, grant: bytes = b"") -> None:
        """A release (or a reconnect) happened: try again now.

        ``grant``: what a fair lock's handoff message says beyond the waiter's
        id (its token and request id), else empty.
        """

    def recheck(self) -> None:
        """Something it may be waiting on changed (a confirmation): look again."""


class CarriesHandoff(Protocol):
    """A subscription as a fair lock's handoff sees it (sync or asyncio, plain or sharded)."""

    #: The last handoff message's rest, empty when none came (see :class:`WakeCount`).
    handoff: bytes


class WakeCount:
    """What both listeners' subscriptions share: a wake-up count and a signal to the sleeper."""

    _wakeups: int = 0
    #: The last handoff message's rest ("<token> <request id>"), taken by the
    #: fair lock's waiter (core/fairlock.py); empty when none came.
    handoff: bytes = b""

    def _signal(self) -> None:
        raise NotImplementedError

    def wake(self, grant: bytes = b"") -> None:
        """A release or a reconnect: retry now (see :class:`ChannelTable`)."""
        if grant:
            self.handoff = grant
        self._wakeups += 1
        self._signal()

    def recheck(self) -> None:
        """A confirmation arrived: look again (see :class:`ChannelTable`)."""
        self._signal()


W = TypeVar("W", bound=Waiter)


class ReadError(enum.Enum):
    """What a failed read of the pub/sub connection means."""

    #: A command was refused; the connection is sound. Log it (the first time).
    REFUSED = "refused"
    #: The same, already logged once.
    REFUSED_AGAIN = "refused again"
    #: The connection broke: drop it, wake every waiter, reconnect.
    BROKEN = "broken"
    #: A cluster node refused a subscription to a slot it no longer serves
    #: (MOVED): a reshard or failover under way. Its waiters retry and
    #: subscribe where the slot is now; told at INFO, every time.
    MOVED = "moved"


@dataclass(eq=False)
class Channel(Generic[W]):
    """One release channel: its waiters and the state of its subscription."""

    name: bytes
    subscriptions: dict[bytes, W] = field(default_factory=dict)
    wanted: bool = False  # a SUBSCRIBE is in force (sent and not unsubscribed)
    sent: int = 0
    acked: int = 0
    #: The server dropped the subscription (its slot moved away) or refused it;
    #: cleared when a SUBSCRIBE is sent again.
    gone: bool = False

    @property
    def settled(self) -> bool:
        """Every SUBSCRIBE sent has been answered."""
        return self.acked >= self.sent


#: How long a channel whose last waiter left with the lock stays subscribed
#: (:meth:`ChannelTable.remove`), in seconds, and how many such channels a
#: listener keeps at most: a lock contended in a loop is taken again within
#: milliseconds, and its next wait then needs no SUBSCRIBE round trip.
LINGER_SECONDS = 1.0
LINGER_MAX = 16


class ChannelTable(Generic[W]):
    """Every channel of one listener (one connection) and its waiters."""

    def __init__(self) -> None:
        self.channels: dict[bytes, Channel[W]] = {}
        self.waiters: dict[bytes, W] = {}
        #: Channels kept subscribed with no waiter (:meth:`remove`'s ``linger``),
        #: oldest first, each with when its last waiter left (monotonic).
        self.lingering: dict[bytes, float] = {}
        #: A connection is up: commands may be sent now.
        self.connected = False
        #: Release messages taken in (for diagnostics and benchmarks: how many
        #: processes a release reaches).
        self.messages = 0
        self._refusal_logged = False

    def subscribed(self) -> set[bytes]:
        """Channels with a subscription in force."""
        return {
            name for name, channel in self.channels.items() if channel.wanted and not channel.gone
        }

    def add(self, name: bytes, waiter: W) -> Channel[W] | None:
        """Register ``waiter`` on channel ``name``; the channel to SUBSCRIBE now, if any."""
        channel = self.channels.get(name)
        if channel is None:
            channel = self.channels[name] = Channel(name)
        self.lingering.pop(name, None)
        key = waiter.waiter_id.encode()
        channel.subscriptions[key] = waiter
        self.waiters[key] = waiter
        if channel.wanted and not channel.gone:
            return None
        channel.wanted = True  # a gone channel: subscribe again (the caller chose this node)
        return channel if self.connected else None

    def add_all(self, names: tuple[bytes, ...], waiter: W) -> list[Channel[W]]:
        """:meth:`add` on each of ``names``; the channels to SUBSCRIBE now (one command)."""
        return [channel for name in names if (channel := self.add(name, waiter)) is not None]

    def remove_all(
        self, names: tuple[bytes, ...], waiter: W, *, linger: float | None = None
    ) -> list[Channel[W]]:
        """:meth:`remove` from each of ``names``; the channels to UNSUBSCRIBE now."""
        return [
            channel
            for name in names
            if (channel := self.remove(name, waiter, linger=linger)) is not None
        ]

    def remove(self, name: bytes, waiter: W, *, linger: float | None = None) -> Channel[W] | None:
        """Forget ``waiter``; the channel to UNSUBSCRIBE now, if it was the last one.

        ``linger``: the time now (monotonic), for a waiter that leaves no
        entry in its lock's waiting set behind (it was granted the lock, or
        never registered): its channels then stay subscribed, with no waiter,
        for :data:`LINGER_SECONDS` (:meth:`expired` ends them), so that the
        next wait for the lock finds them confirmed. A waiter whose entry may
        remain (its ABANDON may have failed) never leaves its wake channel
        subscribed: a release could otherwise hand the lock to that entry,
        with nobody there to take it.
        """
        key = waiter.waiter_id.encode()
        self.waiters.pop(key, None)
        channel = self.channels.get(name)
        if channel is None:
            return None
        channel.subscriptions.pop(key, None)
        if channel.subscriptions or not channel.wanted:
            return None
        if linger is not None and self.connected and not channel.gone:
            self.lingering[name] = linger
            return None
        channel.wanted = False
        self._drop_if_idle(channel)
        return channel if self.connected and not channel.gone else None

    def expired(self, now: float) -> list[Channel[W]]:
        """The lingering channels to UNSUBSCRIBE now: past :data:`LINGER_SECONDS`, or too many.

        Each may be of another lock (on a cluster, of another slot): send
        one command per channel.
        """
        ended = []
        for name, since in list(self.lingering.items()):
            if now - since < LINGER_SECONDS and len(self.lingering) <= LINGER_MAX:
                break  # oldest first: the rest are younger
            del self.lingering[name]
            channel = self.channels.get(name)
            if channel is None or channel.subscriptions:
                continue
            channel.wanted = False
            self._drop_if_idle(channel)
            if self.connected and not channel.gone:
                ended.append(channel)
        return ended

    def subscribe_sent(self, channel: Channel[W]) -> None:
        """A SUBSCRIBE for ``channel`` went out: one more confirmation to wait for."""
        channel.sent += 1
        channel.gone = False

    def confirmed(self, name: bytes) -> bool:
        """Whether the live connection has an answer to channel ``name``'s subscription."""
        channel = self.channels.get(name)
        return self.connected and channel is not None and channel.wanted and channel.settled

    def confirmed_all(self, names: tuple[bytes, ...]) -> bool:
        """Whether every channel of ``names`` is :meth:`confirmed`."""
        return all(self.confirmed(name) for name in names)

    def gone(self, name: bytes) -> bool:
        """Whether the server dropped or refused channel ``name``'s subscription."""
        channel = self.channels.get(name)
        return channel is not None and channel.gone

    def on_connect(self) -> list[Channel[W]]:
        """A new connection is up: the channels to SUBSCRIBE on it. Every waiter retries.

        Anything published while no connection was up is gone, hence the wake-up.
        """
        self.connected = True
        wanted = []
        # A new connection has no subscription: a lingering channel is simply forgotten.
        for name in self.lingering:
            channel = self.channels.get(name)
            if channel is not None and not channel.subscriptions:
                channel.wanted = False
        self.lingering.clear()
        for channel in list(self.channels.values()):
            channel.sent = channel.acked = 0
            if channel.wanted:
                wanted.append(channel)
            else:
                self._drop_if_idle(channel)
        self.wake_all()
        return wanted

    def on_disconnect(self) -> None:
        """The connection is gone (broken or closed): every waiter retries."""
        self.connected = False
        self.wake_all()

    def wake_all(self) -> None:
        """Wake every waiter of every channel."""
        for waiter in self.waiters.values():
            waiter.wake()

    def read_error(self, error: BaseException) -> ReadError:
        """What a failed read means; a refusal answers every pending subscription.

        The refused subscriptions are gone: those of the slot a MOVED names
        (a cluster node that no longer serves it), else every pending one.
        """
        if not isinstance(error, ResponseError):
            return ReadError.BROKEN
        moved = error.slot_id if isinstance(error, MovedError) else None
        for channel in list(self.channels.values()):
            if moved is None:
                channel.gone = channel.gone or not channel.settled
            elif key_slot(channel.name) == moved:
                channel.gone = True
            channel.acked = max(channel.acked, channel.sent)
            self._drop_if_idle(channel)
        self.wake_all()
        if moved is not None:
            return ReadError.MOVED  # not a refusal to warn of: the slot is elsewhere
        if self._refusal_logged:
            return ReadError.REFUSED_AGAIN
        self._refusal_logged = True
        return ReadError.REFUSED

    def deliver(self, reply: Any) -> None:
        """Take in one pub/sub message: wake whom it names, count a confirmation."""
        if not isinstance(reply, list) or len(reply) < 3:
            return
        kind, name, payload = reply[0], reply[1], reply[2]
        channel = self.channels.get(name)
        if kind in (b"message", b"smessage"):
            self.messages += 1
            # A number is Redisson's (layout="redisson": '0' on every release,
            # ours and Java's): like '' it wakes every waiter of the channel.
            # Waiter ids always hold a ':', so no id reads as a number.
            if payload and not payload.isdigit():
                # A message naming another process's waiter is not for us. A
                # fair lock's handoff says more after the name (a space).
                name_of, _, grant = payload.partition(b" ")
                target = self.waiters.get(name_of)
                if target is not None:
                    target.wake(grant)
            elif channel is not None:
                for waiter in channel.subscriptions.values():
                    waiter.wake()
        elif kind == b"sunsubscribe":
            if channel is not None and channel.wanted:
                # Unasked: the channel's slot moved to another node. Its
                # waiters retry now, and subscribe where the slot is (sharding.py).
                channel.gone = True
                for waiter in channel.subscriptions.values():
                    waiter.wake()
        elif kind in (b"subscribe", b"ssubscribe") and channel is not None:
            channel.acked += 1
            for waiter in channel.subscriptions.values():
                waiter.recheck()
            self._drop_if_idle(channel)

    def _drop_if_idle(self, channel: Channel[W]) -> None:
        if not channel.subscriptions and channel.settled and channel.name not in self.lingering:
            self.channels.pop(channel.name, None)


logger = logging.getLogger("django_rlock.waiting")


#: Seconds between reconnect attempts of a listener (the last one repeats).
RECONNECT_BACKOFF = (0.05, 0.1, 0.2, 0.5, 1.0)


def log_refusal(verdict: ReadError, error: BaseException) -> None:
    """Log a refused pub/sub command: a warning the first time, then at debug level.

    A MOVED refusal is no fault: its waiters subscribe where the slot went
    (:mod:`~django_rlock.core._sync.sharding`), so it is told at INFO and
    leaves the one warning for a refusal that makes waiters fall back to
    waiting out the holder's TTL (an ACL without the channel, say).
    """
    if verdict is ReadError.MOVED:
        logger.info(
            "pub/sub subscription refused by a node that no longer serves its slot,"
            " waiters subscribe where it is now: %s",
            error,
        )
        return
    level = logging.WARNING if verdict is ReadError.REFUSED else logging.DEBUG
    logger.log(level, "pub/sub subscription refused, waiters fall back to TTL waits: %s", error)
