"""Soak the lock model: random owners and faults for as long as asked, then a summary.

Run with ``make soak`` (after the process soak; ``SOAK_SECONDS=600`` for ten
minutes) or ``python -m benchmarks.model_soak --seconds 60``. It runs the state
machine of :mod:`tests.model` (sync threads and asyncio tasks on three clients,
each behind its own fault proxy, against a private redis-server on loopback)
example after example with fresh random seeds until the time is up, and
prints the operations done, the faults injected by kind, and every invariant
that broke, with how long into the soak it first did.

``--kind`` picks what the names are: ``lock`` (the default), ``fair`` (fair
locks), ``semaphore`` (two semaphores of 2 permits), ``rwlock`` (two
read-write locks), ``mixed`` (one of each in one world, so one watchdog
renews every kind together), ``owners`` (owners that end their scopes:
threads that end holding, units of work, garbage-collector passes, asyncio
``wait_for``/``shield``/``gather``, leases in units of work, a child process
whose main thread returns; ownership checked from the history, issue 31),
``owners-quiet`` (the same with no fault: a fault excuses what comes near
it), a comma-separated list of those, or ``all``; the time is shared out
evenly and each kind gets its own summary.

By default the paths of the known bugs are open too (``--known-bugs none``
keeps to what the suite's green model runs; ``--known-bugs mixed,close``
opens some): ``mixed`` lease and watchdog re-entry, ``retry`` of an acquire
at once after its reply was lost, ``data-loss`` (FLUSHALL, restarts without
persistence), ``close`` of a client with live holds; for the owners kinds
also ``asyncio-ways``, ``unit-leases`` and ``main-thread`` (the paths of
issue 31's bugs, fixed now: tests/model/test_ownership_bugs.py; ``mixed``
opens the lease hold re-entered with the watchdog there).
Exit status 1 when any invariant broke.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import sys
import time
from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.errors import FlakyStrategyDefinition

from tests.model.history import History, ModelViolation
from tests.model.machine import run_model
from tests.model.test_owner_model import OWNERS, QUIET
from tests.model.world import DATA_LOSS, FAULTS, WAYS, Config

#: The known bugs whose paths the machine can open (see the module docstring).
KNOWN_BUGS = ("mixed", "retry", "data-loss", "close", "asyncio-ways", "unit-leases", "main-thread")

#: How many violations of each invariant the summary shows in full.
SAMPLES = 5

#: What ``--kind`` can pick, each as the names of its worlds (see the module docstring).
KINDS: dict[str, Config] = {
    "lock": Config(),
    "fair": Config(fair=True),
    "semaphore": Config(names=(), semaphores=("s", "t"), permits=2),
    "rwlock": Config(names=(), rw_names=("r", "w")),
    "mixed": Config(names=("a",), semaphores=("s",), permits=2, rw_names=("r",)),
    "owners": OWNERS,
    "owners-quiet": QUIET,
}


class TimeUp(BaseException):
    """An example ended past the soak's time (a BaseException: Hypothesis lets it by)."""


class Tally:
    """What the examples of a soak did, added up as each world closes."""

    def __init__(self, started: float, seconds: float) -> None:
        self.started = started
        self.seconds = seconds
        self.examples = 0
        self.operations: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.violations: Counter[str] = Counter()
        self.first_seen: dict[str, float] = {}
        #: Per invariant, the details of its first SAMPLES violations, with when each came.
        self.samples: dict[str, list[tuple[float, str]]] = {}
        self.elapsed = 0.0

    def finished(self, history: History) -> None:
        self.examples += 1
        self.operations.update(history.operations)
        self.faults.update(history.faults)
        for violation in history.violations:
            self.violations[violation.invariant] += 1
            after = time.monotonic() - self.started
            self.first_seen.setdefault(violation.invariant, after)
            samples = self.samples.setdefault(violation.invariant, [])
            if len(samples) < SAMPLES:
                samples.append((after, violation.detail))

    def after_step(self) -> None:
        if time.monotonic() - self.started >= self.seconds:
            raise TimeUp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0, help="how long to run")
    parser.add_argument("--steps", type=int, default=60, help="steps per example at most")
    parser.add_argument(
        "--known-bugs",
        default="all",
        help="paths of known bugs to open: all, none, or some of " + ",".join(KNOWN_BUGS),
    )
    parser.add_argument(
        "--kind",
        default="lock",
        help="what to soak: all, or some of " + ",".join(KINDS) + " (the time is shared out)",
    )
    parser.add_argument("--verbose", action="store_true", help="show the library's warnings")
    args = parser.parse_args(argv)
    kinds = list(KINDS) if args.kind == "all" else args.kind.split(",")
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kind: unknown {sorted(set(kinds) - set(KINDS))}")
    if not args.verbose:
        logging.getLogger("django_rlock").setLevel(logging.ERROR)

    opened = set(KNOWN_BUGS) if args.known_bugs == "all" else set()
    if args.known_bugs not in ("all", "none"):
        opened = set(args.known_bugs.split(","))
        if not opened <= set(KNOWN_BUGS):
            parser.error(f"--known-bugs: unknown {sorted(opened - set(KNOWN_BUGS))}")
    args.opened = sorted(opened)
    # A hang is a finding too: show where every thread is, then stop.
    faulthandler.dump_traceback_later(args.seconds + 600, exit=True)
    broken = False
    for kind in kinds:
        config = replace(
            KINDS[kind],
            faults=FAULTS
            | (DATA_LOSS if "data-loss" in opened else frozenset())
            | ({"close"} if "close" in opened else set()),
            mixed_reentry="mixed" in opened,
            retry_unanswered="retry" in opened,
        )
        if kind.startswith("owners"):
            config = replace(
                config,
                # Their own faults: no lost replies (each would excuse the rest of its run).
                faults=KINDS[kind].faults,
                ways=WAYS if "asyncio-ways" in opened else OWNERS.ways,
                unit_leases="unit-leases" in opened,
                processes="main-thread" in opened,
            )
        tally = soak(args, config, args.seconds / len(kinds))
        print_summary(args, kind, config, tally)
        broken = broken or bool(tally.violations)
    return 1 if broken else 0


def soak(args: argparse.Namespace, config: Config, seconds: float) -> Tally:
    """Run the machine of ``config`` example after example for ``seconds``."""
    started = time.monotonic()
    tally = Tally(started, seconds)
    run = settings(
        max_examples=1_000_000,
        stateful_step_count=args.steps,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # no shrinking: timing makes a replay differ
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        verbosity=Verbosity.quiet,  # the summary reports; Hypothesis need not
    )
    failures = 0
    while time.monotonic() - started < seconds:
        # Each run goes on until an invariant breaks (then a new one starts) or time is up.
        try:
            run_model(config, run, tally.finished, tally.after_step)
        except TimeUp:
            break
        except FlakyStrategyDefinition:
            # Stopping mid-example (TimeUp) can end a choice sequence Hypothesis
            # has seen go further, which it reports so: time is up all the same.
            if time.monotonic() - started < seconds:
                raise
            break
        except ModelViolation as error:
            failures += 1
            if failures == 1 or args.verbose:
                print(f"\nfirst failing example:\n{error}\n", file=sys.stderr)
    tally.elapsed = time.monotonic() - started
    return tally


def print_summary(args: argparse.Namespace, kind: str, config: Config, tally: Tally) -> None:
    """The soak's outcome for one kind as markdown tables."""
    owners = (
        f"{config.sync_clients * config.owners_per_client} threads on {config.sync_clients} "
        f"clients, {config.async_owners} asyncio tasks on one"
        + (f", {config.unit_workers} unit-of-work threads" if config.unit_workers else "")
    )
    names = [
        *(f"{name} (fair lock)" if config.fair else name for name in config.names),
        *(f"{name} (semaphore of {config.permits})" for name in config.semaphores),
        *(f"{name} (read-write lock)" for name in config.rw_names),
    ]
    print(
        f"\nModel soak, kind {kind}: {owners}, names {', '.join(names)}, watchdog timeout "
        f"{config.watchdog_timeout:g}s, {tally.elapsed:.0f}s, {tally.examples} examples, "
        f"known-bug paths open: {', '.join(args.opened) or 'none'}\n"
    )
    print("| operation | count |\n|---|---:|")
    for outcome, count in sorted(tally.operations.items()):
        print(f"| {outcome} | {count:,} |")
    print("\n| fault injected | count |\n|---|---:|")
    for fault, count in sorted(tally.faults.items()):
        print(f"| {fault} | {count:,} |")
    print("\n| invariant broken | times | first after |\n|---|---:|---:|")
    if not tally.violations:
        print("| (none) | 0 | |")
    for invariant, count in sorted(tally.violations.items()):
        print(f"| {invariant} | {count:,} | {tally.first_seen[invariant]:.0f} s |")
    for invariant, samples in sorted(tally.samples.items()):
        for after, detail in samples:
            print(f"\n{invariant}, after {after:.0f} s: {detail}")


if __name__ == "__main__":
    sys.exit(main())
