"""The lock order check's graph (core/_process/lockorder.py): cycles found, none invented.

Holds are recorded by a real :class:`HoldRegistry` with stand-in locks (the
few attributes the registry reads), as the engines' grants record them; each
test has a graph of its own. The engines and the Django face, on a real
redis-server, are tested in tests/process/test_lock_order.py and
tests/django/test_lock_order.py.
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from django_rlock.core import LockOrderWarning
from django_rlock.core._process.lockorder import LockOrder, check_lock_order_check
from django_rlock.core._protocol.holds import Hold, HoldRegistry
from django_rlock.core._protocol.names import LockKeys

pytestmark = pytest.mark.pure


@dataclass(eq=False)
class StubLock:
    keys: LockKeys
    key_template: str | None = None
    max_hold: float | None = None
    lost_callbacks: list[Callable[[Any], object]] = field(default_factory=list)

    def hold_keys(self, owner: str) -> tuple[str, str]:
        return self.keys.hash, self.keys.fence

    def give_back_leaked(self, hold: Hold) -> None:
        raise AssertionError("no hold leaks here")


class Process:
    """One registry watched by one graph, and owners taking and giving back locks."""

    def __init__(self, max_edges: int = 10_000) -> None:
        self.order = LockOrder(max_edges)
        self.registry = HoldRegistry()
        self.order.watch(self.registry)

    def take(self, owner: str, name: str, template: str | None = None) -> Hold:
        lock = StubLock(LockKeys.build("p", name), key_template=template)
        return self.registry.grant(
            lock, owner, token=1, holds=1, lease=10.0, sent_at=0.0, pttl_ms=10_000
        )

    def give_back(self, hold: Hold) -> None:
        self.registry.released(hold, left=0)

    def nest(self, owner: str, *names: str) -> None:
        """``owner`` takes ``names`` one inside the other, then gives them back."""
        holds = [self.take(owner, name) for name in names]
        for hold in reversed(holds):
            self.give_back(hold)


@pytest.fixture
def caught() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


def inversions(seen: list[warnings.WarningMessage]) -> list[LockOrderWarning]:
    return [w.message for w in seen if isinstance(w.message, LockOrderWarning)]


def test_two_owners_in_opposite_orders_are_reported_once_naming_both_sites(
    caught: list[warnings.WarningMessage],
) -> None:
    process = Process()
    process.nest("t1", "order:1", "customer:7")
    assert inversions(caught) == []
    process.nest("t2", "customer:7", "order:1")  # no deadlock: t1 is done
    (warning,) = inversions(caught)
    now, earlier = warning.cycle
    assert (now.held, now.taken) == ("customer:7", "order:1")
    assert (earlier.held, earlier.taken) == ("order:1", "customer:7")
    # Both pairs of call sites are this file's lines (the first frames outside the library).
    for site in (now.held_at, now.taken_at, earlier.held_at, earlier.taken_at):
        assert site.filename == __file__
    assert str(earlier.taken_at) in str(warning) and str(now.taken_at) in str(warning)
    assert caught[0].filename == __file__ and caught[0].lineno == now.taken_at.lineno
    process.nest("t3", "customer:7", "order:1")  # the same inversion again: told once
    process.nest("t1", "customer:7", "order:1")
    assert len(inversions(caught)) == 1


def test_a_longer_cycle_is_found_with_every_edge(caught: list[warnings.WarningMessage]) -> None:
    process = Process()
    process.nest("t1", "a", "b")
    process.nest("t2", "b", "c")
    assert inversions(caught) == []
    process.nest("t3", "c", "a")
    (warning,) = inversions(caught)
    assert [(edge.held, edge.taken) for edge in warning.cycle] == [
        ("c", "a"),
        ("a", "b"),
        ("b", "c"),
    ]


def test_one_global_order_reentry_and_one_class_nested_raise_nothing(
    caught: list[warnings.WarningMessage],
) -> None:
    process = Process()
    for owner in ("t1", "t2", "t3"):
        process.nest(owner, "a", "b", "c", "d")
        process.nest(owner, "a", "c")
        process.nest(owner, "b", "d")
    # order:1 then order:2 and order:2 then order:1 are one class: lockdep's "nested".
    first = process.take("t4", "order:1", "order:{id}")
    second = process.take("t4", "order:2", "order:{id}")
    process.give_back(second)
    process.give_back(first)
    first = process.take("t5", "order:2", "order:{id}")
    second = process.take("t5", "order:1", "order:{id}")
    assert inversions(caught) == []
    assert process.order.edges == 6  # a<b<c<d; the one class added none


def test_templates_are_the_classes_whatever_the_ids(caught: list[warnings.WarningMessage]) -> None:
    process = Process()
    a = process.take("t1", "order:1", "order:{order_id}")
    b = process.take("t1", "customer:7", "customer:{customer_id}")
    process.give_back(b)
    process.give_back(a)
    process.take("t2", "customer:8", "customer:{customer_id}")
    process.take("t2", "order:2", "order:{order_id}")
    (warning,) = inversions(caught)
    assert (warning.cycle[0].held, warning.cycle[0].taken) == (
        "customer:{customer_id}",
        "order:{order_id}",
    )


def test_locks_held_by_other_owners_make_no_edge(caught: list[warnings.WarningMessage]) -> None:
    process = Process()
    process.take("t1", "a")
    process.take("t2", "b")  # t2 holds nothing else
    process.take("t2", "a")  # b then a, for t2 only
    process.take("t1", "c")  # a then c, for t1
    assert process.order.edges == 2
    assert inversions(caught) == []


def test_the_graph_is_bounded(caught: list[warnings.WarningMessage]) -> None:
    process = Process(max_edges=3)
    for n in range(10):
        process.nest("t1", "root", f"leaf:{n}")
    assert process.order.edges == 3
    process.nest("t1", "leaf:0", "root")  # a known order inverted: still seen
    assert len(inversions(caught)) == 1


def test_a_warning_made_an_error_is_kept_not_raised_from_the_grant() -> None:
    process = Process()
    mark = process.order.raised_mark()
    process.nest("t1", "a", "b")
    with warnings.catch_warnings():
        # A filter for this module's code: the warning is attributed to the user's call site.
        warnings.filterwarnings("error", category=LockOrderWarning, module=re.escape(__name__))
        hold_b = process.take("t2", "b")
        hold_a = process.take("t2", "a")  # granted: the error is kept for the caller's test
    assert hold_a.count == 1 and process.registry.keeps(hold_a) and process.registry.keeps(hold_b)
    (error,) = process.order.raised_since(mark)
    assert isinstance(error, LockOrderWarning) and "'a'" in str(error)
    assert process.order.raised_since(process.order.raised_mark()) == []


def test_owners_on_many_threads_find_the_one_inversion(
    caught: list[warnings.WarningMessage],
) -> None:
    process = Process()
    start = threading.Barrier(8)

    def run(n: int) -> None:
        start.wait(timeout=30)
        for _ in range(50):
            process.nest(f"t{n}", "a", "b", "c")
        if n == 0:
            process.nest(f"t{n}", "c", "a")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    (warning,) = inversions(caught)
    assert (warning.cycle[0].held, warning.cycle[0].taken) == ("c", "a")


@pytest.mark.parametrize("value", [None, 1, "yes"])
def test_the_option_takes_a_bool_only(value: object) -> None:
    with pytest.raises(ValueError, match="lock_order_check must be True or False"):
        check_lock_order_check(value)
