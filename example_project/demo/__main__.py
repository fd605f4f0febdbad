"""Run the demo from ``example_project/``: ``python -m demo`` (``--help`` lists the options).

The phases, in order, each in a module of its own and each handing on a frozen
outcome (:mod:`demo.outcomes`): ``environment`` (Redis, Django), ``start``
(database, worker, server), ``drive`` (the load, with the ``kill`` and ``pause``
scenarios, watched by the renewal ``monitor``), ``tasks`` (every task waited
for), ``ledger`` (the database checked), ``picture`` (the ``timeline`` of who
held which lock when, drawn). Whatever happens, the ``session`` then stops
everything the run started; ``checks`` and ``report`` turn the outcomes into
the table, the ``--json`` file and the exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType

from demo.checks import render, report_checks
from demo.console import Console
from demo.environment import configure
from demo.monitor import RenewalMonitor, report_lock
from demo.outcomes import Measured, Picture
from demo.plan import FULL, QUICK, Plan
from demo.report import is_ok, json_report
from demo.session import Session
from demo.timeline import Recorded, Timeline

#: Where the timeline's SVG and HTML page go by default (under example_project/, ignored by git).
TIMELINE_DIR = Path("var")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="The example shop under load, on real processes, checked step by step.",
    )
    parser.add_argument("--quick", action="store_true", help="a 15 s run (for the tests)")
    parser.add_argument("--duration", type=float, help="seconds of load (default 60)")
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--keep", action="store_true", help="keep the database and logs")
    parser.add_argument(
        "--timeline",
        type=Path,
        default=TIMELINE_DIR,
        metavar="DIR",
        help=f"write demo-timeline.svg and .html here (default {TIMELINE_DIR}/)",
    )
    return parser.parse_args(argv)


def run(session: Session, plan: Plan, console: Console, timeline_dir: Path) -> Measured:
    """The phases of one run, in order: what they measured."""
    env = configure(session, plan, console)
    # These phases import the shop's models at their top, which Django allows
    # only once it is set up: by configure(), just above.
    from demo.drive import drive  # noqa: PLC0415
    from demo.holders import name_report_holders  # noqa: PLC0415
    from demo.ledger import check_ledger  # noqa: PLC0415
    from demo.start import start_shop  # noqa: PLC0415
    from demo.tasks import wait_for_tasks  # noqa: PLC0415

    shop = start_shop(session, env, plan, console)
    timeline = Timeline()
    reports = [report_lock(customer) for customer in shop.customers]
    with RenewalMonitor(reports, timeline) as monitor:
        load = drive(shop, monitor, session, plan, console)
        # Meanwhile the reports in flight go on holding, and renewing, their locks.
        tasks = wait_for_tasks(load, plan, console)
    renewals = monitor.summary(killed_token=load.kill.token)
    ledger = check_ledger(shop, load.kill)
    name_report_holders(timeline)
    recorded = timeline.recorded()
    return Measured(
        shop, load, tasks, renewals, ledger, recorded, draw_timeline(recorded, timeline_dir)
    )


def draw_timeline(recorded: Recorded, directory: Path) -> Picture:
    """The timeline drawn in ``directory``; a failure to draw it is a failed check, not a crash."""
    try:
        # matplotlib (the demo extra) is imported only for the drawing.
        from demo.picture import draw  # noqa: PLC0415
    except ImportError as error:
        return Picture(error=f"cannot draw the timeline ({error}): pip install 'matplotlib>=3.8'")
    try:
        return draw(recorded, directory, title="django-rlock demo: who held which lock when")
    except Exception as error:  # noqa: BLE001 -- reported as a failed check
        return Picture(error=f"{type(error).__name__}: {error}")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    if args.duration:
        plan = dataclasses.replace(plan, duration=args.duration)
    signal.signal(signal.SIGTERM, _interrupt)
    # Python leaves SIGINT ignored when it starts ignored (a background job of
    # a script, a test runner started so): Ctrl-C must stop the demo anyway.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    console = Console()
    session = Session(keep=args.keep)
    print("django-rlock demo: the example shop under load, on real processes\n", flush=True)
    measured: Measured | None = None
    error = ""
    interrupted = False
    try:
        measured = run(session, plan, console, args.timeline)
    except KeyboardInterrupt:
        interrupted = True
        console.end_progress()
        error = "interrupted"
        print("\ninterrupted: stopping everything the demo started...", flush=True)
    except Exception as failure:  # noqa: BLE001 -- any failure is reported, then everything stops
        console.end_progress()
        error = f"{type(failure).__name__}: {failure}"
        traceback.print_exc()
    finally:
        # A second Ctrl-C must not cut the cleanup short; every step of it is bounded.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopped = session.stop(interrupted=interrupted)
    elapsed = round(console.elapsed(), 1)
    checks = [] if measured is None else report_checks(plan, measured, stopped)
    ok = is_ok(checks)
    if checks:
        print()
        print(render(checks))
    if measured is not None and not measured.picture.error:
        print(f"\ntimeline: {measured.picture.svg}\n          {measured.picture.html}")
    verdict = "all checks passed" if ok else "FAILED: " + (error or "see above")
    print(f"\n{verdict} in {elapsed:.0f}s ({session.redis})")
    if args.json:
        report = json_report(
            plan=plan,
            redis=session.redis,
            elapsed=elapsed,
            measured=measured,
            stopped=stopped,
            checks=checks,
            error=error,
        )
        args.json.write_text(json.dumps(report, indent=2, default=str))
    if interrupted:
        return 130
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
