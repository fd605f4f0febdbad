"""Every LockError pickles as itself, with its attributes.

A Celery worker stores a failed task's exception pickled, and replaces one that does
not round-trip by its first base class that does: before, a LockUnavailableError
(``server=`` is a required keyword) was stored and logged as a plain LockError
(tests/celery/test_unavailable.py shows it on a real worker).
"""

from __future__ import annotations

import pickle

import pytest

from django_rlock.core import LockError, LockTimeout, LockUnavailableError, RateLimitExceeded
from django_rlock.core.exceptions import LockLostError, LockNotReplicatedError

pytestmark = pytest.mark.pure

ERRORS = [
    LockUnavailableError("cannot acquire lock 'a'", name="a", server="redis://h:1/0"),
    LockNotReplicatedError("not replicated", name="a", required=2, acknowledged=1),
    LockTimeout("busy", name="a", retry_after=2.5),
    RateLimitExceeded("rate limit 1/m of 'a' reached", name="a", retry_after=59.5),
    LockLostError("lost", name="a"),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: type(error).__name__)
def test_a_lock_error_round_trips_through_pickle(error: LockError) -> None:
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert copy.args == error.args
    assert vars(copy) == vars(error)


def test_an_unavailable_error_rebuilds_from_its_message_alone() -> None:
    # Celery's JSON result backend rebuilds an exception as cls(message).
    error = LockUnavailableError("RLOCKS['default'] unreachable")
    assert str(error) == "RLOCKS['default'] unreachable"
    assert error.server is None
