"""Deadlock detection without a server: the plan's checks, the walk, the edge, the victim rule.

The walk is driven by a dict standing for Redis (lock hash -> its grant and
fields, edge key -> value); the plan by a scripted shell on the protocol's
clock seam, so check times are exact without sleeping.
"""

from __future__ import annotations

from typing import Any

import pytest

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.deadlocks import (
    LOCK,
    MAX_CYCLE,
    READ,
    WRITE,
    Cycle,
    Detector,
    Edge,
    Wait,
    check_deadlock_timeout,
    deadlock_error,
    edge_key,
    edge_life,
    walk,
)
from django_rlock.core._protocol.plan import AcquirePlan, drive, second_look
from django_rlock.core.exceptions import DeadlockError, LockError

pytestmark = pytest.mark.pure

PREFIX = "t"


def lock_key(name: str) -> str:
    return f"{PREFIX}:{{{name}}}"


class Graph:
    """What Redis would answer: locks (holder, token), read-write locks, semaphores, wait edges."""

    def __init__(self) -> None:
        self.holds: dict[str, tuple[bytes | None, list[bytes]]] = {}
        self.edges: dict[str, str] = {}
        #: Read-write lock base -> (writer or None, {reader: read holds}).
        self.rw: dict[str, tuple[str | None, dict[str, int]]] = {}
        #: Semaphore index -> {holder: permits}.
        self.sems: dict[str, dict[str, int]] = {}

    def hold(self, name: str, owner: str, token: int, thread: str = "T") -> None:
        description = f'{{"host":"h","pid":1,"thread":"{thread}"}}'.encode()
        fields = [owner.encode(), b"1", b"~holder", description, b"~since", b"1700000000000"]
        self.holds[lock_key(name)] = (str(token).encode(), fields)

    def wait(
        self, owner: str, name: str, started_ms: int = 1, call: str = "c", what: str = LOCK
    ) -> None:
        wait = Wait.parse(what, rw_base(name) if what in (READ, WRITE) else key_of(name, what))
        assert wait is not None
        self.edges[edge_key(PREFIX, owner)] = Edge(started_ms, call, 0, wait).encode()

    def run(self, owner: str, name: str, what: str = LOCK) -> Cycle | None:
        wait = Wait.parse(what, rw_base(name) if what in (READ, WRITE) else key_of(name, what))
        assert wait is not None
        steps = walk(PREFIX, owner, wait)
        try:
            read = next(steps)
            while True:
                read = steps.send(self.answer(read))
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def answer(self, read: tuple[str, Any]) -> Any:
        if read[0] == "edge":
            return self.edges.get(read[1])
        call = read[1]
        if read[0] == "read_hold":
            assert call.keys == [call.keys[0], f"{call.keys[0]}:fence"]
            token, fields = self.holds.get(call.keys[0], (None, []))
            return [token, fields]
        if read[0] == "read_rw":
            base = call.keys[0].removesuffix(":write")
            writer, readers = self.rw.get(base, (None, {}))
            if writer is None:
                described = [b"~holder", b'{"host":"h","pid":2,"thread":"R"}']
                return [
                    None,
                    [],
                    [x for r in sorted(readers) for x in (r, [r.encode(), b"1", *described])],
                ]
            return [b"7", [writer.encode(), b"1"], []]
        assert read[0] == "read_semaphore"
        holders = self.sems.get(call.keys[0], {})
        return [
            x
            for holder in sorted(holders)
            for x in (holder.encode(), [holder.encode(), str(holders[holder]).encode()])
        ]


def key_of(name: str, what: str) -> str:
    return f"{lock_key(name)}:sem" if what.startswith("sem") else lock_key(name)


def rw_base(name: str) -> str:
    return f"{lock_key(name)}:rw"


def test_a_cycle_of_two_comes_back_to_the_caller() -> None:
    graph = Graph()
    graph.hold("a", "o1", 10, thread="one")
    graph.hold("b", "o2", 20, thread="two")
    graph.wait("o2", "a")
    cycle = graph.run("o1", "b")
    assert cycle is not None
    assert [link.lock for link in cycle.links] == [lock_key("b"), lock_key("a")]
    assert [link.holder["thread"] for link in cycle.links if link.holder] == ["two", "one"]
    assert [edge.lock for edge in cycle.edges] == [lock_key("a")]
    assert [link.wait for link in cycle.links] == [
        Wait(LOCK, lock_key("b")),
        Wait(LOCK, lock_key("a")),
    ]


def test_a_chain_that_ends_at_a_running_holder_is_no_cycle() -> None:
    graph = Graph()
    for i in range(5):
        graph.hold(f"l{i}", f"o{i}", i + 1)
    for i in range(1, 4):
        graph.wait(f"o{i}", f"l{i + 1}")  # o4 holds l4 and does not wait
    assert graph.run("o0", "l1") is None


def test_a_free_lock_ends_the_walk() -> None:
    assert Graph().run("o1", "free") is None


def test_waiting_on_a_cycle_one_is_not_part_of_is_no_cycle_for_it() -> None:
    graph = Graph()
    graph.hold("a", "o1", 1)
    graph.hold("b", "o2", 2)
    graph.wait("o1", "b")
    graph.wait("o2", "a")
    assert graph.run("tail", "a") is None  # the cycle's own members break it


def test_a_lock_the_caller_holds_itself_is_never_a_cycle() -> None:
    graph = Graph()
    graph.hold("mine", "o1", 1)
    assert graph.run("o1", "mine") is None


def test_a_lock_with_no_grant_or_several_holders_ends_the_walk() -> None:
    graph = Graph()
    graph.holds[lock_key("sem")] = (None, [b"o2", b"1"])  # no fencing counter: not a plain grant
    assert graph.run("o1", "sem") is None
    graph.holds[lock_key("two")] = (b"5", [b"o2", b"1", b"o3", b"1"])
    assert graph.run("o1", "two") is None


def test_the_walk_is_bounded() -> None:
    graph = Graph()
    size = MAX_CYCLE + 5
    for i in range(size):
        graph.hold(f"l{i}", f"o{i}", i + 1)
        graph.wait(f"o{i}", f"l{i + 1}")
    graph.hold(f"l{size}", "o0", 999)
    assert graph.run("o0", "l1") is None


def test_an_edge_keeps_a_lock_key_with_spaces_and_refuses_garbage() -> None:
    edge = Edge(1_700_000_000_123, "abc", 3, Wait(LOCK, "t:{a lock with spaces}"))
    assert Edge.decode(edge.encode()) == edge
    assert Edge.decode(edge.encode().encode()) == edge
    semaphore = Edge(1, "abc", 0, Wait("sem", "t:{s}:sem", 3))
    assert Edge.decode(semaphore.encode()) == semaphore
    assert semaphore.encode() == "1 abc 0 sem3 t:{s}:sem"
    # The plain lock's first format (no word) and unknown words are no edges.
    for raw in (None, b"", "x y", "1 c x key", 42, "1 c 0 t:{a}", "1 c 0 sem0 k", "1 c 0 no k"):
        assert Edge.decode(raw) is None


def test_the_victim_is_the_call_that_began_last_whatever_the_incarnation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    detector = Detector(PREFIX, "o1", lock_key("b"), 0.5, clock.monotonic())
    mine = Edge.decode(detector.edge_value())
    assert mine is not None
    older = Edge(mine.started_ms - 1, "zzz", 7, Wait(LOCK, lock_key("a")))
    newer = Edge(mine.started_ms + 1, "000", 0, Wait(LOCK, lock_key("a")))
    assert detector.is_victim(Cycle((), (older,), ()))
    assert not detector.is_victim(Cycle((), (newer,), ()))
    detector.written = True
    rewritten = Edge.decode(detector.edge_value())
    assert rewritten is not None and rewritten.incarnation == 1
    assert rewritten.rank == mine.rank


def test_the_error_names_every_lock_and_holder() -> None:
    graph = Graph()
    graph.hold("order:1", "o1", 10, thread="worker-1")
    graph.hold("customer:7", "o2", 20, thread="worker-2")
    graph.wait("o2", "order:1")
    cycle = graph.run("o1", "customer:7")
    assert cycle is not None
    error = deadlock_error(PREFIX, "customer:7", cycle, clock.monotonic())
    assert isinstance(error, LockError)
    assert error.name == "customer:7"
    assert [entry["lock"] for entry in error.cycle] == ["customer:7", "order:1"]
    text = str(error)
    assert "'customer:7' held by h pid 1 thread 'worker-2'" in text
    assert "'order:1' held by h pid 1 thread 'worker-1'" in text
    assert "o1" not in text.replace("order:1", "")  # never an owner id


@pytest.mark.parametrize("value", [0, -0.5, float("inf"), float("nan"), "1", True])
def test_a_bad_deadlock_timeout_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="deadlock_timeout"):
        check_deadlock_timeout(value)


def test_an_edge_outlives_two_missed_checks() -> None:
    assert edge_life(1.0) == 3.0
    assert edge_life(0.1) == 2.0


# -- the plan ----------------------------------------------------------------------


class Shell:
    """A waiter whose lock stays held (PTTL ``pttl``), never woken; checks are recorded."""

    def __init__(self, pttl: float, *, raise_at_check: int | None = None) -> None:
        self.now = 0.0
        self.pttl = pttl
        self.steps: list[tuple[Any, ...]] = []
        self.subscription = self
        self.raise_at_check = raise_at_check

    def __call__(self) -> float:
        return self.now

    def attempt(self, waiter: bool, sleep: float) -> float | None:
        self.steps.append(("attempt", round(self.now, 3)))
        return self.pttl

    def listen(self) -> None:
        pass

    def wait_subscribed(self, timeout: float) -> None:
        pass

    def mark(self) -> int:
        return 0

    def wait(self, since: int, timeout: float) -> bool:
        self.now += timeout
        return False

    def check_deadlock(self) -> None:
        self.steps.append(("check", round(self.now, 3)))
        checks = sum(1 for step in self.steps if step[0] == "check")
        if checks == self.raise_at_check:
            raise DeadlockError("cycle", name="x")


def test_a_waiter_checks_after_deadlock_timeout_a_second_look_then_every_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shell = Shell(pttl=30.0)
    monkeypatch.setattr(clock, "monotonic", shell)
    made = AcquirePlan(blocking=True, wait=3.2, watchdog_timeout=30.0, deadlock_timeout=1.0)
    assert drive(made, shell) is False
    # One attempt before waiting and one as a registered waiter: the checks
    # cut the sleep and resume it, with no attempt between them. The second
    # check comes a tenth of the interval after the first (plan.second_look):
    # the victim of a cycle whose first checks ran the other way round finds
    # it then, not a whole interval later.
    assert shell.steps == [
        ("attempt", 0.0),
        ("attempt", 0.0),
        ("check", 1.0),
        ("check", 1.1),
        ("check", 2.1),
        ("check", 3.1),
    ]


def test_the_second_look_is_a_tenth_of_the_interval_at_least_20_ms() -> None:
    assert second_look(1.0) == pytest.approx(0.1)
    assert second_look(0.1) == pytest.approx(0.02)
    assert second_look(0.01) == pytest.approx(0.01)  # never later than the interval


def test_without_deadlock_timeout_a_sleep_is_one_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    shell = Shell(pttl=30.0)
    monkeypatch.setattr(clock, "monotonic", shell)
    made = AcquirePlan(blocking=True, wait=3.2, watchdog_timeout=30.0)
    assert drive(made, shell) is False
    assert shell.steps == [("attempt", 0.0), ("attempt", 0.0)]


def test_short_sleeps_check_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """A holder whose PTTL is short makes the waiter retry often: checks stay on schedule."""
    shell = Shell(pttl=0.4)
    monkeypatch.setattr(clock, "monotonic", shell)
    made = AcquirePlan(blocking=True, wait=2.5, watchdog_timeout=30.0, deadlock_timeout=1.0)
    assert drive(made, shell) is False
    checks = [step[1] for step in shell.steps if step[0] == "check"]
    assert checks == [1.0, 1.1, 2.1]  # a sleep is cut at the due time, then resumed
    attempts = [step[1] for step in shell.steps if step[0] == "attempt"]
    assert attempts == [0.0, 0.0, 0.4, 0.8, 1.2, 1.6, 2.0, 2.4]  # one per PTTL, as before


def test_a_check_that_raises_ends_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    shell = Shell(pttl=30.0, raise_at_check=2)
    monkeypatch.setattr(clock, "monotonic", shell)
    made = AcquirePlan(blocking=True, wait=None, watchdog_timeout=30.0, deadlock_timeout=0.5)
    with pytest.raises(DeadlockError):
        drive(made, shell)
    assert made.registered is True  # the shell's close leaves the waiting set


# -- the other kinds ------------------------------------------------------------------


def test_a_writer_waiting_for_a_reader_that_waits_for_the_writers_lock_is_a_deadlock() -> None:
    graph = Graph()
    graph.hold("plain", "writer", 10, thread="w")
    graph.rw[rw_base("rw")] = (None, {"reader": 1, "runner": 1})
    graph.wait("writer", "rw", started_ms=5, what=WRITE)
    cycle = graph.run("reader", "plain")
    assert cycle is not None
    assert [link.wait.mode for link in cycle.links if link.wait] == [LOCK, WRITE]
    error = deadlock_error(PREFIX, "plain", cycle, clock.monotonic())
    assert [entry["kind"] for entry in error.cycle] == ["lock", "read_write_lock"]
    assert [entry["lock"] for entry in error.cycle] == ["plain", "rw"]
    assert "the write lock of 'rw' kept from it by h pid 2 thread 'R'" in str(error)
    assert error.cycle[1]["holder"]["thread"] == "R"  # the reader, as its read key describes it
    # The writer's own search finds the same deadlock: one victim between them.
    graph.wait("reader", "plain", started_ms=9)
    assert graph.run("writer", "rw", WRITE) is not None


def test_a_reader_waiting_for_a_writer_that_waits_for_its_lock_is_a_deadlock() -> None:
    graph = Graph()
    graph.hold("plain", "reader", 10)
    graph.rw[rw_base("rw")] = ("writer", {})
    graph.wait("writer", "plain")
    cycle = graph.run("reader", "rw", READ)
    assert cycle is not None
    assert (
        "a read lock of 'rw' kept from it by"
        in deadlock_error(PREFIX, "rw", cycle, clock.monotonic()).args[0]
    )


def test_read_write_waits_that_end_never_count() -> None:
    graph = Graph()
    graph.rw[rw_base("rw")] = (None, {"r1": 1, "r2": 1})
    graph.hold("plain", "w", 1)
    graph.wait("r1", "plain")  # waits for the writer's lock, but r2 runs: the writer waits
    # for both readers, r2 will release, r1 will not: stuck only if the writer is.
    graph.wait("w", "rw", what=WRITE)
    assert graph.run("r1", "plain") is not None  # a real cycle: r1 -> w -> r1
    graph.edges.pop(edge_key(PREFIX, "w"))
    assert graph.run("r1", "plain") is None  # the writer runs
    # A writer alone with its own read (re-entry inside write) waits for nobody.
    graph.rw[rw_base("mine")] = (None, {"w": 1})
    assert graph.run("w", "mine", WRITE) is None
    # A reader never waits for readers; a writer that holds the write never waits either.
    graph.rw[rw_base("read")] = (None, {"r1": 1})
    assert graph.run("x", "read", READ) is None
    graph.rw[rw_base("held")] = ("w", {"w": 1})
    assert graph.run("w", "held", READ) is None


def test_a_semaphore_whose_every_permit_is_held_by_stuck_owners_is_a_deadlock() -> None:
    graph = Graph()
    graph.sems[key_of("s", "sem2")] = {"a": 1, "b": 1}
    graph.hold("la", "c", 1)
    graph.hold("lb", "c", 2)
    graph.wait("a", "la")
    graph.wait("b", "lb")
    cycle = graph.run("c", "s", "sem2")
    assert cycle is not None
    assert {edge.lock for edge in cycle.edges} == {lock_key("la"), lock_key("lb")}
    error = deadlock_error(PREFIX, "s", cycle, clock.monotonic())
    assert error.cycle[0]["kind"] == "semaphore" and error.cycle[0]["lock"] == "s"
    assert "semaphore 's' (permits=2)" in str(error)
    # One holder that runs will give its permit back: no deadlock.
    graph.edges.pop(edge_key(PREFIX, "b"))
    assert graph.run("c", "s", "sem2") is None
    # A permit free: not even waiting.
    graph.wait("b", "lb")
    assert graph.run("c", "s", "sem3") is None


def test_a_semaphore_held_whole_by_its_own_waiter_is_a_deadlock_of_one() -> None:
    graph = Graph()
    graph.sems[key_of("s", "sem1")] = {"me": 1}
    cycle = graph.run("me", "s", "sem1")
    assert cycle is not None and cycle.edges == ()
    detector = Detector(PREFIX, "me", Wait("sem", key_of("s", "sem1"), 1), 0.5, clock.monotonic())
    assert detector.is_victim(cycle)


def test_a_semaphore_that_a_deadlock_elsewhere_will_free_is_waited_for() -> None:
    graph = Graph()
    # a and b deadlock on two locks; a also holds a permit of s (2 permits),
    # the caller the other, and the caller waits for a second permit.
    graph.hold("x", "a", 1)
    graph.hold("y", "b", 2)
    graph.wait("a", "y", started_ms=1)
    graph.wait("b", "x", started_ms=2)
    graph.sems[key_of("s", "sem2")] = {"a": 1, "me": 1}
    assert graph.run("me", "s", "sem2") is None  # a's deadlock's victim will free a permit
    graph.wait("me", "s", what="sem2")
    cycle = graph.run("a", "y")
    assert cycle is not None and {edge.lock for edge in cycle.edges} == {lock_key("x")}


def test_a_fair_lock_handed_to_its_waiter_blocks_nobody() -> None:
    graph = Graph()
    graph.holds[f"{lock_key('f')}:fair"] = (b"3", [b"me", b"1", b"~handoff", b"q1"])
    steps = walk(PREFIX, "me", Wait(LOCK, f"{lock_key('f')}:fair"))
    read = next(steps)
    assert read[0] == "read_hold" and read[1].keys[1] == f"{lock_key('f')}:fair:fence"
    with pytest.raises(StopIteration) as done:
        steps.send([b"3", [b"me", b"1", b"~handoff", b"q1"]])
    assert done.value.value is None
