"""What each phase of a run hands on: small frozen records, read by the checks and the report.

``start_shop`` gives a :class:`Shop`; the load phase a :class:`Load` (with the two
scenarios' :class:`Kill` and :class:`Pause`); waiting for the tasks :class:`Tasks`;
the renewal monitor :class:`Renewals`; the ledger check :class:`Ledger`; the
timeline drawn :class:`Picture` (with the :class:`~demo.timeline.Recorded` it
drew); stopping everything :class:`Stopped`. Their fields are the ``--json`` report's.
"""

from __future__ import annotations

from dataclasses import dataclass

from demo.timeline import Recorded


@dataclass(frozen=True)
class Shop:
    """The shop, running: its server's port, its seeded rows, its worker."""

    port: int
    customers: tuple[int, ...]
    orders: tuple[int, ...]
    worker_pid: int  # the worker's main process (and process group)


@dataclass(frozen=True)
class HttpTotals:
    """What the HTTP clients saw."""

    served: int
    by_status: dict[str, int]
    conflicts_without_retry_after: int
    errors: int
    first_errors: tuple[str, ...]


@dataclass(frozen=True)
class Kill:
    """The report run whose worker process was SIGKILLed, and how long its lock outlived it."""

    customer: int
    task_id: str
    pid: int = 0
    token: int = 0
    held_before_kill: float = 0.0
    freed_after: float | None = None
    killed_at: float = 0.0  # time.monotonic() of the kill
    error: str = ""


@dataclass(frozen=True)
class Pause:
    """The holder paused past its lease, and what its late write and release met."""

    order: int
    token: int = 0
    lease: float = 0.0
    refused: bool = False
    release_raised: str = ""
    overtaken_by: int = 0
    error: str = ""


@dataclass(frozen=True)
class Load:
    """What the load phase sent and what its two scenarios saw."""

    http: HttpTotals
    capture_ids: tuple[str, ...]  # the capture tasks sent
    report_tasks: tuple[tuple[int, str], ...]  # (customer, task id) of the reports queued
    kill: Kill
    pause: Pause


@dataclass(frozen=True)
class CaptureTotals:
    """How the capture tasks ended."""

    sent: int
    succeeded: int
    failed: int
    unfinished: int
    retries: int
    retried_tasks: int
    failures: tuple[str, ...]


@dataclass(frozen=True)
class ReportTotals:
    """How the report tasks ended."""

    queued: int
    succeeded: int
    unfinished: int
    retries: int
    lost: int
    runs: int
    killed_run_finished: bool
    failures: tuple[str, ...]


@dataclass(frozen=True)
class Tasks:
    """Every task of the run, finished (or given up on)."""

    captures: CaptureTotals
    reports: ReportTotals


@dataclass(frozen=True)
class Renewals:
    """The report locks' renewals, seen from outside.

    ``renewals`` counts every grant's; the longest hold and lowest TTL leave out
    the grant whose holder was SIGKILLed (it never finished).
    """

    renewals: int
    longest_hold: float = 0.0
    lowest_ttl: float | None = None


@dataclass(frozen=True)
class Ledger:
    """The database after the run: overlapping critical sections and wrong balances."""

    orders: int
    violations: tuple[str, ...]
    inconsistent_orders: tuple[str, ...]


@dataclass(frozen=True)
class Picture:
    """The timeline's files, and what they show: holds, renewals, the kinds of labelled marks."""

    svg: str = ""  # absolute paths
    html: str = ""
    holds: int = 0
    renewals: int = 0
    marked: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class Measured:
    """Everything a complete run measured, phase by phase."""

    shop: Shop
    load: Load
    tasks: Tasks
    renewals: Renewals
    ledger: Ledger
    timeline: Recorded
    picture: Picture


@dataclass(frozen=True)
class Stopped:
    """What was still running after everything the demo started was stopped."""

    left_running: tuple[str, ...]
