"""The model as a Hypothesis state machine: random operations and faults, invariants after each.

:func:`machine_for` builds a ``RuleBasedStateMachine`` over a fresh
:class:`~tests.model.world.World` per example. Rules hand operations to the
owners (who carry them out concurrently) and inject the faults the
:class:`~tests.model.world.Config` allows; the invariant reads the history
after every step. Grants go into a bundle, so releases mostly aim at what was
asked for; another rule releases anything, which must then be refused.

Names of every kind the config lists are drawn alike; for a read-write lock
an operation also draws its side (``read`` or ``write``), so owners read,
write, read while writing and ask to write while reading.

When the config lets owners end their scopes (threads that end, units of
work, asyncio ``wait_for``/``shield``/``gather``, a child process whose main
thread returns, garbage-collector passes), the machine is a subclass with a
rule for each, and acquires draw how they ask; without, it draws exactly as
before.

Each example ends by releasing everything and checking that nothing grew
(keys, channels, connections, threads), see :meth:`World.close`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.model.history import History, ModelViolation
from tests.model.world import (
    DATA_LOSS,
    WAYS,
    Acquire,
    Config,
    EndThread,
    NextUnit,
    Release,
    World,
)

__all__ = ["ViolationFound", "machine_for", "run_model"]


class ViolationFound(BaseException):
    """Carries a :class:`ModelViolation` out of Hypothesis, which lets BaseExceptions by.

    Hypothesis replays a failing example to report it; a timing-dependent
    failure may not recur, which it would call Flaky. The steps that led to a
    violation are in its message instead (see History.steps).
    """

    def __init__(self, violation: ModelViolation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def run_model(
    config: Config,
    run: settings,
    finished: Callable[[History], None] | None = None,
    after_step: Callable[[], None] | None = None,
) -> None:
    """Run the machine of ``config`` under ``run``; raise the first violation it finds."""
    try:
        run_state_machine_as_test(machine_for(config, finished, after_step), settings=run)
    except ViolationFound as found:
        raise found.violation from None


#: How long an owner waits for a busy lock; None is one attempt (blocking=False).
WAITS = (None, 0.3, 0.8, 1.5)


def machine_for(
    config: Config,
    finished: Callable[[History], None] | None = None,
    after_step: Callable[[], None] | None = None,
) -> type[RuleBasedStateMachine]:
    """A state machine class over worlds made from ``config``.

    ``finished`` receives each example's history once its world is closed
    (the soak adds them up); ``after_step`` is called after every step's
    checks (the soak stops there when its time is up, by raising a BaseException).
    """
    owners = st.integers(0, config.owners - 1)
    names = st.sampled_from(config.all_names)
    # Drawn only when a read-write lock is in the run, so runs without one draw
    # exactly as before; a side is ignored for names that have none.
    sides = st.sampled_from(["read", "write"]) if config.rw_names else st.just("")
    leases = st.one_of(st.none(), st.sampled_from(config.leases))
    clients = st.integers(0, config.clients - 1)
    # Up to about twice the watchdog timeout: long enough to outlast renewals.
    spans = st.sampled_from([0.2, 0.5, 1.0, 1.6])
    owning = bool(
        config.thread_ends
        or config.unit_workers
        or config.gc_passes
        or config.processes
        or set(config.ways) - {"acquire"}
    )
    ways = (*config.ways, *(("cycle",) if config.gc_passes else ()))
    # Drawn only when there is a choice, so runs without draw exactly as before.
    hows = st.sampled_from(ways) if len(ways) > 1 else st.just(ways[0])
    tasks = range(
        config.sync_clients * config.owners_per_client,
        config.sync_clients * config.owners_per_client + config.async_owners,
    )

    def how_for(owner: int, how: str) -> str:
        """A thread asks with acquire() (or through a cycle): the asyncio ways are a task's."""
        return how if owner in tasks or how not in WAYS else "acquire"

    def allowed(fault: str) -> Callable[[object], bool]:
        return lambda _machine: fault in config.faults

    class LockModel(RuleBasedStateMachine):
        grants = Bundle("grants")

        def __init__(self) -> None:
            super().__init__()
            self.world = World(config)

        # -- owners --------------------------------------------------------------------

        def side(self, name: str, drawn: str) -> str:
            return drawn if name in config.rw_names else ""

        @initialize(target=grants, owner=owners, name=names)
        def opening_grant(self, owner: int, name: str) -> tuple[int, str, str]:
            # Every example opens with a grant on a fresh world (a write for a
            # read-write name), whatever its later draws: an example whose
            # draws are mostly faults still exercises holds, and the bounded
            # runs can count on one grant per example.
            side = self.side(name, "write")
            self.world.submit(owner, Acquire(name, None, 1.5, side))
            return owner, name, side

        @rule(
            target=grants,
            owner=owners,
            name=names,
            lease=leases,
            wait=st.sampled_from(WAITS),
            side=sides,
            how=hows,
        )
        def acquire(
            self,
            *,
            owner: int,
            name: str,
            lease: float | None,
            wait: float | None,
            side: str,
            how: str,
        ) -> tuple[int, str, str]:
            side = self.side(name, side)
            self.world.submit(owner, Acquire(name, lease, wait, side, how_for(owner, how)))
            return owner, name, side

        @rule(
            target=grants,
            contenders=st.lists(owners, min_size=2, max_size=4, unique=True),
            name=names,
            lease=leases,
            wait=st.sampled_from(WAITS),
            side=sides,
            how=hows,
        )
        def contend(
            self,
            *,
            contenders: list[int],
            name: str,
            lease: float | None,
            wait: float | None,
            side: str,
            how: str,
        ) -> MultipleResults[tuple[int, str, str]]:
            side = self.side(name, side)
            for owner in contenders:
                self.world.submit(owner, Acquire(name, lease, wait, side, how_for(owner, how)))
            return multiple(*((owner, name, side) for owner in contenders))

        @rule(grant=consumes(grants))
        def release_what_was_asked(self, grant: tuple[int, str, str]) -> None:
            owner, name, side = grant
            self.world.submit(owner, Release(name, side))

        @rule(owner=owners, name=names, side=sides)
        def release_anything(self, owner: int, name: str, side: str) -> None:
            self.world.submit(owner, Release(name, self.side(name, side)))

        @rule(seconds=st.sampled_from([0.05, 0.2, 0.5, 1.0]))
        def time_passes(self, seconds: float) -> None:
            time.sleep(seconds)

        @rule()
        def owners_finish(self) -> None:
            self.world.settle()

        # -- faults ------------------------------------------------------------------

        @precondition(allowed("partition"))
        @rule(client=clients, seconds=spans)
        def partition(self, client: int, seconds: float) -> None:
            self.world.partition(client, seconds)

        @precondition(allowed("stall"))
        @rule(seconds=spans, how=st.sampled_from(["pause", "sleep"]))
        def stall(self, seconds: float, how: str) -> None:
            self.world.stall(seconds, how)

        @precondition(allowed("drop_reply"))
        @rule(client=clients)
        def reply_lost_by_reset(self, client: int) -> None:
            self.world.lose_reply(client, "drop")

        @precondition(allowed("swallow_reply"))
        @rule(client=clients)
        def reply_lost_in_silence(self, client: int) -> None:
            self.world.lose_reply(client, "swallow")

        @precondition(allowed("client_kill"))
        @rule(kind=st.sampled_from(["normal", "pubsub"]))
        def client_kill(self, kind: str) -> None:
            self.world.client_kill(kind)

        @precondition(allowed("force_release"))
        @rule(name=names)
        def operator_force_releases(self, name: str) -> None:
            self.world.force_release(name)

        @precondition(lambda _machine: bool(DATA_LOSS & config.faults))
        @rule(restart=st.booleans(), down_for=st.sampled_from([0.0, 0.3]))
        def server_loses_its_data(self, restart: bool, down_for: float) -> None:
            if restart and "restart" in config.faults:
                self.world.restart(down_for)
            elif "flushall" in config.faults:
                self.world.flushall()
            else:
                self.world.restart(down_for)

        @precondition(allowed("close"))
        @rule(client=clients)
        def close_client_with_live_holds(self, client: int) -> None:
            self.world.close_client(client)

        # -- invariants ----------------------------------------------------------------

        @invariant()
        def no_violation(self) -> None:
            try:
                self.world.check()
            except ModelViolation as violation:
                raise ViolationFound(violation) from None
            if after_step is not None:
                after_step()

        def teardown(self) -> None:
            # After a violation, only clean up: the violation is the report.
            try:
                self.world.close(check=not self.world.history.violations)
            except ModelViolation as violation:
                raise ViolationFound(violation) from None
            finally:
                if finished is not None:
                    finished(self.world.history)

    LockModel.__name__ = LockModel.__qualname__ = "LockModel"
    if not owning:
        return LockModel
    thread_owners = st.sampled_from(config.thread_owners or (0,))
    unit_owners = st.sampled_from(config.unit_owners or (0,))

    class OwnerModel(LockModel):
        """The lock model with owners that end their scopes (see the module docstring)."""

        @precondition(lambda _machine: config.thread_ends and bool(config.thread_owners))
        @rule(owner=thread_owners)
        def a_thread_ends(self, owner: int) -> None:
            self.world.submit(owner, EndThread())

        @precondition(lambda _machine: bool(config.unit_workers))
        @rule(owner=unit_owners)
        def a_unit_of_work_ends(self, owner: int) -> None:
            self.world.submit(owner, NextUnit())

        @precondition(lambda _machine: config.gc_passes)
        @rule(generation=st.sampled_from([0, 1, 2]))
        def garbage_collector_runs(self, generation: int) -> None:
            self.world.gc_pass(generation)

        @precondition(lambda _machine: config.processes and bool(config.names))
        @rule(
            target=LockModel.grants,
            name=st.sampled_from(config.names or ("",)),
            rival=owners,
            works_for=st.sampled_from([0.5, 1.5]),
        )
        def a_main_thread_returns(
            self, name: str, rival: int, works_for: float
        ) -> tuple[int, str, str]:
            # A rival asks while the child's worker thread works on.
            self.world.main_thread_returns(name, works_for)
            self.world.submit(rival, Acquire(name, None, 1.0))
            return rival, name, ""

    OwnerModel.__name__ = OwnerModel.__qualname__ = "OwnerModel"
    return OwnerModel
