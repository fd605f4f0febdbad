"""Which cluster refusals mean "the slot is moving", and how long a refused call is resent.

No server: the refusals are redis-py's own exception types and Redis's words,
and the sends are plain functions (the real cluster is in
tests/topologies/test_cluster_operations.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import redis.exceptions as redis_errors

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.unavailable import (
    UNREACHABLE,
    refused_for_slot,
    reported_unavailable,
)
from django_rlock.core._sync import sharding
from django_rlock.core.exceptions import LockUnavailableError

pytestmark = pytest.mark.pure

NON_LOCAL = redis_errors.ResponseError(
    "Script attempted to access a non local key in a cluster node script: 7f61e2, "
    "on @user_script:8."
)

REFUSALS = [
    redis_errors.ClusterError("TTL exhausted."),
    redis_errors.ClusterDownError("CLUSTERDOWN The cluster is down"),
    redis_errors.TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"),
    redis_errors.AskError("3999 127.0.0.1:6381"),
    redis_errors.MovedError("3999 127.0.0.1:6381"),
    redis_errors.SlotNotCoveredError('Slot "3999" is not covered by the cluster.'),
    NON_LOCAL,
]


@pytest.mark.parametrize("error", REFUSALS, ids=lambda error: type(error).__name__)
def test_a_moving_slot_is_reported_as_unavailable(error: Exception) -> None:
    assert refused_for_slot(error)
    with (
        pytest.raises(LockUnavailableError, match="cannot serve the lock's slot now") as raised,
        reported_unavailable("cluster", "acquire", "order:1"),
    ):
        raise error
    assert raised.value.__cause__ is error
    assert raised.value.name == "order:1"


@pytest.mark.parametrize(
    "error",
    [
        redis_errors.ResponseError("WRONGTYPE Operation against a key holding the wrong kind"),
        redis_errors.NoScriptError("NOSCRIPT No matching script"),
        redis_errors.ConnectionError("refused"),
    ],
)
def test_other_errors_are_no_slot_refusal(error: Exception) -> None:
    assert not refused_for_slot(error)
    assert isinstance(error, UNREACHABLE) == isinstance(error, redis_errors.ConnectionError)


class Sends:
    """A call refused ``refusals`` times (with ``error``), then answered; time moves by hand."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, refusals: int, error: Exception) -> None:
        self.now = 100.0
        self.sent = 0
        self.pauses: list[float] = []
        self.refusals, self.error = refusals, error
        monkeypatch.setattr(clock, "monotonic", lambda: self.now)
        # Only sharding's pauses: its `time` module is replaced, not the process's.
        monkeypatch.setattr(sharding, "time", SimpleNamespace(sleep=self._sleep))

    def _sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds

    def __call__(self) -> str:
        self.sent += 1
        self.now += 0.4  # redis-py's own tries of a TRYAGAIN
        if self.sent <= self.refusals:
            raise self.error
        return "answered"


def test_a_refused_call_is_resent_until_the_slot_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    send = Sends(monkeypatch, 5, redis_errors.ClusterError("TTL exhausted."))
    assert sharding.resend_while_settling(send, until=110.0) == "answered"
    assert send.sent == 6
    assert send.pauses == [0.02, 0.04, 0.08, 0.16, 0.25]  # doubling, at most 0.25 s


def test_no_pause_ends_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    send = Sends(monkeypatch, 1000, redis_errors.TryAgainError("TRYAGAIN"))
    with pytest.raises(redis_errors.TryAgainError):
        sharding.resend_while_settling(send, until=102.0)
    assert send.now <= 102.0 + 0.4  # the last send may take redis-py's own tries
    assert send.sent == 5


def test_a_bound_already_past_sends_once(monkeypatch: pytest.MonkeyPatch) -> None:
    send = Sends(monkeypatch, 1, redis_errors.ClusterError("TTL exhausted."))
    with pytest.raises(redis_errors.ClusterError):
        sharding.resend_while_settling(send, until=0.0)
    assert send.sent == 1
    assert send.pauses == []


def test_a_scripts_refused_key_comes_out_as_a_cluster_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # So that the engine's `except UNREACHABLE` takes it (the words alone say what it is).
    send = Sends(monkeypatch, 1, NON_LOCAL)
    with pytest.raises(redis_errors.ClusterError, match="non local key") as raised:
        sharding.resend_while_settling(send, until=0.0)
    assert raised.value.__cause__ is NON_LOCAL


def test_other_errors_are_raised_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    send = Sends(monkeypatch, 3, redis_errors.ResponseError("WRONGTYPE"))
    with pytest.raises(redis_errors.ResponseError, match="WRONGTYPE"):
        sharding.resend_while_settling(send, until=math.inf)
    assert send.sent == 1
