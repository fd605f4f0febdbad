"""The channel table: what a release listener (un)subscribes, when a subscription counts as
confirmed, whom a message wakes, and what a failed read means."""

from __future__ import annotations

import logging

import pytest
import redis

from django_rlock.core._protocol.channels import (
    LINGER_MAX,
    LINGER_SECONDS,
    WAKE_MARK,
    WAKE_ONLY_MARK,
    ChannelTable,
    ReadError,
    listen_channels,
    log_refusal,
    new_wake_name,
)

pytestmark = pytest.mark.pure

A = b"p:{a}:released"
B = b"p:{b}:released"


class Waiter:
    """Records its wake-ups and rechecks."""

    def __init__(self, waiter_id: str) -> None:
        self.waiter_id = waiter_id
        self.woken: list[bytes] = []
        self.rechecked = 0

    def wake(self, grant: bytes = b"") -> None:
        self.woken.append(grant)

    def recheck(self) -> None:
        self.rechecked += 1


def connected() -> ChannelTable[Waiter]:
    table: ChannelTable[Waiter] = ChannelTable()
    assert table.on_connect() == []
    return table


def confirm(table: ChannelTable[Waiter], name: bytes) -> None:
    table.deliver([b"subscribe", name, 1])


def test_the_first_waiter_subscribes_and_the_last_one_unsubscribes() -> None:
    table = connected()
    first, second = Waiter("w1"), Waiter("w2")
    channel = table.add(A, first)
    assert channel is not None and channel.name == A
    assert table.add(A, second) is None  # already subscribed
    assert table.subscribed() == {A}
    assert table.remove(A, first) is None  # w2 still waits
    left = table.remove(A, second)
    assert left is not None and left.name == A
    assert table.subscribed() == set()


def test_a_subscription_counts_only_once_every_subscribe_sent_is_answered() -> None:
    table = connected()
    waiter = Waiter("w1")
    channel = table.add(A, waiter)
    assert channel is not None
    table.subscribe_sent(channel)
    assert not table.confirmed(A)
    confirm(table, A)
    assert table.confirmed(A)
    assert waiter.rechecked == 1  # told to look again


def test_a_late_confirmation_of_an_old_subscription_cannot_pass_for_a_new_one() -> None:
    table = connected()
    old, new = Waiter("w1"), Waiter("w2")
    channel = table.add(A, old)
    assert channel is not None
    table.subscribe_sent(channel)
    unsubscribe = table.remove(A, old)
    assert unsubscribe is channel  # the channel waits for its confirmation
    again = table.add(A, new)
    assert again is channel
    table.subscribe_sent(channel)
    confirm(table, A)  # answers the first SUBSCRIBE only
    assert not table.confirmed(A)
    confirm(table, A)
    assert table.confirmed(A)


def test_an_idle_channel_is_dropped_once_every_confirmation_came() -> None:
    table = connected()
    waiter = Waiter("w1")
    channel = table.add(A, waiter)
    assert channel is not None
    table.subscribe_sent(channel)
    table.remove(A, waiter)
    assert A in table.channels  # a confirmation is still due
    confirm(table, A)
    assert A not in table.channels


def test_while_disconnected_nothing_is_sent_and_a_connection_subscribes_all_wanted() -> None:
    table: ChannelTable[Waiter] = ChannelTable()
    a, b, gone = Waiter("w1"), Waiter("w2"), Waiter("w3")
    assert table.add(A, a) is None
    assert table.add(B, b) is None
    assert table.add(b"p:{c}:released", gone) is None
    table.remove(b"p:{c}:released", gone)
    assert not table.confirmed(A)
    wanted = table.on_connect()
    assert sorted(channel.name for channel in wanted) == [A, B]
    # Anything published while no connection was up is gone: every waiter retries.
    assert a.woken == [b""] and b.woken == [b""] and gone.woken == []


def test_a_new_connection_must_confirm_again() -> None:
    table = connected()
    waiter = Waiter("w1")
    channel = table.add(A, waiter)
    assert channel is not None
    table.subscribe_sent(channel)
    confirm(table, A)
    assert table.confirmed(A)
    table.on_disconnect()
    assert not table.confirmed(A)
    assert waiter.woken == [b""]
    (again,) = table.on_connect()
    assert again is channel
    table.subscribe_sent(again)  # the count starts over on the new connection
    assert not table.confirmed(A)
    confirm(table, A)
    assert table.confirmed(A)


def test_a_message_naming_a_waiter_wakes_that_waiter_alone() -> None:
    table = connected()
    named, other = Waiter("w1"), Waiter("w2")
    table.add(A, named)
    table.add(A, other)
    table.deliver([b"message", A, b"w1"])
    assert named.woken == [b""] and other.woken == []


def test_a_handoff_message_hands_its_grant_to_the_named_waiter() -> None:
    table = connected()
    head = Waiter("q1")
    table.add(A, head)
    table.deliver([b"smessage", A, b"q1 17 rid-9"])
    assert head.woken == [b"17 rid-9"]


def test_a_message_naming_another_process_waiter_wakes_nobody() -> None:
    table = connected()
    waiter = Waiter("w1")
    table.add(A, waiter)
    table.deliver([b"message", A, b"someone-else"])
    assert waiter.woken == []


def test_an_empty_message_wakes_every_waiter_of_its_channel_only() -> None:
    table = connected()
    on_a, also_a, on_b = Waiter("w1"), Waiter("w2"), Waiter("w3")
    table.add(A, on_a)
    table.add(A, also_a)
    table.add(B, on_b)
    table.deliver([b"message", A, b""])
    assert on_a.woken == [b""] and also_a.woken == [b""] and on_b.woken == []


def test_an_unasked_sunsubscribe_wakes_the_channels_waiters() -> None:
    # The channel's slot moved to another node: retry now.
    table = connected()
    waiter = Waiter("w1")
    table.add(A, waiter)
    table.deliver([b"sunsubscribe", A, 0])
    assert waiter.woken == [b""]


@pytest.mark.parametrize("reply", [None, b"pong", [b"message", A], [b"pong", b""]])
def test_other_replies_change_nothing(reply: object) -> None:
    table = connected()
    waiter = Waiter("w1")
    table.add(A, waiter)
    table.deliver(reply)
    assert waiter.woken == [] and waiter.rechecked == 0


def test_a_refused_subscribe_answers_the_pending_subscriptions_and_is_logged_once() -> None:
    table = connected()
    waiter = Waiter("w1")
    channel = table.add(A, waiter)
    assert channel is not None
    table.subscribe_sent(channel)
    refusal = redis.ResponseError("NOPERM this user has no permissions to access the channel")
    assert table.read_error(refusal) is ReadError.REFUSED
    # No confirmation will come: the waiter stops waiting for one, and retries.
    assert table.confirmed(A)
    assert waiter.woken == [b""]
    assert table.read_error(refusal) is ReadError.REFUSED_AGAIN


@pytest.mark.parametrize(
    "error", [redis.ConnectionError("reset"), redis.TimeoutError("timed out"), OSError("EPIPE")]
)
def test_any_other_read_error_means_the_connection_broke(error: BaseException) -> None:
    table = connected()
    waiter = Waiter("w1")
    channel = table.add(A, waiter)
    assert channel is not None
    table.subscribe_sent(channel)
    assert table.read_error(error) is ReadError.BROKEN
    assert not table.confirmed(A)  # the listener reconnects and subscribes again


def test_a_waiter_with_a_wake_name_listens_on_the_shared_and_its_wake_channel() -> None:
    name = new_wake_name()
    assert name.startswith(WAKE_MARK)
    assert listen_channels(A, f"{name}:3") == (A, A + b":" + name.encode())
    # An older version's id (a hex listener id): the shared channel alone.
    assert listen_channels(A, "0123456789abcdef:3") == (A,)


def test_both_channels_of_a_waiter_are_subscribed_at_once_and_confirmed_together() -> None:
    table = connected()
    waiter = Waiter(f"{new_wake_name()}:1")
    names = listen_channels(A, waiter.waiter_id)
    assert [channel.name for channel in table.add_all(names, waiter)] == list(names)
    for channel in table.channels.values():
        table.subscribe_sent(channel)
    confirm(table, names[0])
    assert not table.confirmed_all(names)
    confirm(table, names[1])
    assert table.confirmed_all(names)
    # A message on the wake channel naming the waiter wakes it, and is counted.
    table.deliver([b"message", names[1], waiter.waiter_id.encode()])
    assert waiter.woken == [b""]
    assert table.messages == 1
    assert [channel.name for channel in table.remove_all(names, waiter)] == list(names)


def test_an_unasked_sunsubscribe_leaves_the_channel_gone_until_subscribed_again() -> None:
    # A cluster node dropped it (the slot moved): not in force, nothing to unsubscribe.
    table = connected()
    leaving, staying = Waiter("w1"), Waiter("w2")
    channel = table.add(A, leaving)
    assert channel is not None
    table.subscribe_sent(channel)
    table.add(A, staying)
    confirm(table, A)
    table.deliver([b"sunsubscribe", A, 0])
    assert table.gone(A) and table.subscribed() == set()
    assert table.remove(A, leaving) is None
    # A waiter that joins the gone channel subscribes it again (on the node its owner chose).
    joining = Waiter("w3")
    assert table.add(A, joining) is channel
    table.subscribe_sent(channel)
    assert not table.gone(A) and table.subscribed() == {A}


def test_the_last_waiter_of_a_gone_channel_sends_no_unsubscribe() -> None:
    table = connected()
    waiter = Waiter("w1")
    channel = table.add(A, waiter)
    assert channel is not None
    table.subscribe_sent(channel)
    confirm(table, A)
    table.deliver([b"sunsubscribe", A, 0])
    assert table.remove(A, waiter) is None
    assert A not in table.channels


def test_a_moved_refusal_leaves_only_the_channels_of_its_slot_gone() -> None:
    from redis.crc import key_slot  # noqa: PLC0415 -- this test alone computes slots

    table = connected()
    on_a, on_b = Waiter("w1"), Waiter("w2")
    for name, waiter in ((A, on_a), (B, on_b)):
        channel = table.add(name, waiter)
        assert channel is not None
        table.subscribe_sent(channel)
    refusal = redis.exceptions.MovedError(f"{key_slot(A)} 127.0.0.1:7001")
    assert table.read_error(refusal) is ReadError.MOVED
    assert table.gone(A) and not table.gone(B)
    # Both pending subscriptions are answered, and every waiter retries.
    assert table.confirmed(A) and table.confirmed(B)
    assert on_a.woken == [b""] and on_b.woken == [b""]


def test_a_moved_refusal_is_told_as_a_move_and_leaves_the_warning_for_a_real_refusal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from redis.crc import key_slot  # noqa: PLC0415 -- this test alone computes slots

    table = connected()
    channel = table.add(A, Waiter("w1"))
    assert channel is not None
    table.subscribe_sent(channel)
    moved = redis.exceptions.MovedError(f"{key_slot(A)} 127.0.0.1:7001")
    with caplog.at_level(logging.DEBUG, logger="django_rlock.waiting"):
        log_refusal(table.read_error(moved), moved)
        log_refusal(table.read_error(moved), moved)
        refusal = redis.ResponseError("NOPERM this user has no permissions")
        log_refusal(table.read_error(refusal), refusal)
    told = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert [level for level, _ in told] == [logging.INFO, logging.INFO, logging.WARNING]
    assert all("subscribe where it is now" in message for _, message in told[:2])
    assert "fall back to TTL waits" in told[2][1]


def test_any_other_refusal_leaves_the_pending_subscriptions_gone() -> None:
    table = connected()
    settled, pending = Waiter("w1"), Waiter("w2")
    channel = table.add(A, settled)
    assert channel is not None
    table.subscribe_sent(channel)
    confirm(table, A)
    channel = table.add(B, pending)
    assert channel is not None
    table.subscribe_sent(channel)
    table.read_error(redis.ResponseError("NOPERM this user has no permissions"))
    assert table.gone(B) and not table.gone(A)


def test_a_wake_only_name_listens_on_its_wake_channel_too() -> None:
    """A cluster's waiters: woken on their wake channel, never handed a lock (lua._HAND_OVER)."""
    name = new_wake_name(hand_over=False)
    assert name.startswith(WAKE_ONLY_MARK) and not name.startswith(WAKE_MARK)
    assert listen_channels(A, f"{name}:3") == (A, A + b":" + name.encode())


def subscribed_and_confirmed(table: ChannelTable[Waiter], name: bytes, waiter: Waiter) -> None:
    channel = table.add(name, waiter)
    assert channel is not None
    table.subscribe_sent(channel)
    confirm(table, name)


def test_a_granted_waiters_channel_lingers_confirmed_for_the_next_wait() -> None:
    table = connected()
    subscribed_and_confirmed(table, A, Waiter("w1"))
    assert table.remove(A, Waiter("w1"), linger=100.0) is None  # no UNSUBSCRIBE
    assert table.subscribed() == {A}
    confirm(table, A)  # a late confirmation does not drop it
    assert table.add(A, Waiter("w2")) is None  # no SUBSCRIBE
    assert table.confirmed(A)
    assert table.expired(10_000.0) == []  # it has a waiter again


def test_lingering_channels_end_after_linger_seconds_or_beyond_the_most() -> None:
    table = connected()
    for number in range(LINGER_MAX + 1):
        name = b"p:{%d}:released" % number
        subscribed_and_confirmed(table, name, Waiter(f"w{number}"))
        assert table.remove(name, Waiter(f"w{number}"), linger=100.0 + number) is None
    # One more than LINGER_MAX: the oldest ends now, the others after LINGER_SECONDS.
    assert [channel.name for channel in table.expired(100.0)] == [b"p:{0}:released"]
    assert table.expired(100.0) == []
    ended = table.expired(100.0 + LINGER_MAX + LINGER_SECONDS)
    assert len(ended) == LINGER_MAX
    assert table.subscribed() == set()
    assert table.channels == {}


def test_a_waiter_that_may_leave_an_entry_unsubscribes_at_once() -> None:
    table = connected()
    subscribed_and_confirmed(table, A, Waiter("w1"))
    left = table.remove(A, Waiter("w1"))  # no linger: its ABANDON may have failed
    assert left is not None and left.name == A
    assert table.lingering == {}


def test_a_new_connection_forgets_lingering_channels() -> None:
    table = connected()
    subscribed_and_confirmed(table, A, Waiter("w1"))
    table.remove(A, Waiter("w1"), linger=100.0)
    table.on_disconnect()
    assert table.on_connect() == []  # nothing to subscribe again
    assert table.lingering == {}
    assert table.channels == {}
