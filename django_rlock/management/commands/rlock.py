"""``manage.py rlock``: look at held locks and break one when you must.

::

    manage.py rlock list [PATTERN]         # held locks whose name matches the glob
    manage.py rlock inspect NAME           # holders, hold counts, TTL, fencing token,
                                           # waiters, who waits for whom (wait edges)
                                           # (and the rate limiter NAME's state, if any)
    manage.py rlock release NAME --force   # delete it whoever holds it (asks first)

Every action takes ``--using ALIAS`` (default ``default``) and ``--json``.
Listing walks the keys with SCAN, never KEYS, so it does not block the server.
Holders are shown as ``<digest of the process id>:<thread id>``: the raw owner
id is a credential and is never printed.

``inspect`` also shows who waits for whom around the lock, from the wait edges
deadlock detection keeps (:mod:`django_rlock._observers.waitgraph`): the owners that have
waited for it longer than ``RLOCK_DEADLOCK_TIMEOUT``, and what its holder itself
waits for, lock by lock, flagged when the path comes back to the lock (a deadlock).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_rlock._handler import locks
from django_rlock._observers.waitgraph import Waits, read_waits
from django_rlock.backends.base import BaseLockBackend, LockInfo
from django_rlock.backends.redis import RedisLockBackend
from django_rlock.core._faces import LimiterState
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS
from django_rlock.exceptions import LockSettingError, LockUnavailableError


def _ttl_text(ttl: float | None) -> str:
    if ttl is None:
        return "-"
    if math.isinf(ttl):
        return "no expiry"
    return f"{ttl:.1f}s"


def _held_for_text(info: LockInfo) -> str:
    seconds = info.held_for()
    return "-" if seconds is None else f"{seconds:.1f}s"


def _as_json(info: LockInfo) -> dict[str, Any]:
    ttl = info.ttl
    return {
        "name": info.name,
        "held": True,
        "holders": info.holders,
        "holds": sum(info.holders.values()),
        "ttl": None if ttl is None or math.isinf(ttl) else round(ttl, 3),
        "token": info.token,
        "waiters": info.waiters,
        "holder": info.holder,
        "lease": info.lease,
    }


def _limiter_json(state: LimiterState) -> dict[str, Any]:
    return {
        "rate": state.rate,
        "burst": state.burst,
        "available": state.available,
        "next_in": round(state.next_in, 3),
        "full_in": round(state.full_in, 3),
        "place": _place_json(state),
    }


def _place_json(state: LimiterState) -> dict[str, Any] | None:
    """The polite callers' kept place (docs/rate-limits.md, fairness); None when none is kept."""
    if state.place_in is None:
        return None
    return {"permits": state.place, "in": round(state.place_in, 3), "booked": state.place_booked}


def _place_lines(state: LimiterState) -> list[str]:
    """``inspect``'s lines for the polite callers' kept place (none when none is kept)."""
    if state.place_in is None:
        return []
    permits = f"{state.place} permit{'s' if state.place != 1 else ''}"
    when = (
        f"due in {state.place_in:.3f}s"
        if state.place_in >= 0
        else f"due {-state.place_in:.3f}s ago, kept a little longer"
    )
    booked = "counted" if state.place_booked else "not yet counted (acquire() goes after it)"
    return [
        f"  kept place: {permits} for the polite callers (try_acquire, wait_time), {when};",
        f"              {booked}",
    ]


def _standard_options(parser: CommandParser) -> list[argparse.Action]:
    """Django's options every command takes (--settings, -v, --traceback...).

    They are on the command's parser when ``add_arguments`` runs. Read from
    ``_actions``, as Django's own ``call_command`` reads them.
    """
    return [
        action
        for action in parser._actions
        if action.option_strings and action.dest not in ("help", "version")
    ]


def _accept(sub: CommandParser, option: argparse.Action) -> None:
    """Let an action's parser take ``option`` after the action's name too.

    Its default is SUPPRESS: an option given before the action name (read by
    the command's own parser) is not overwritten by the action parser's default.
    """
    kind: dict[str, Any] = (
        {"action": "store_true"}
        if option.nargs == 0
        else {"type": option.type, "choices": option.choices, "metavar": option.metavar}
    )
    sub.add_argument(
        *option.option_strings,
        dest=option.dest,
        default=argparse.SUPPRESS,
        help=option.help,
        **kind,
    )


def _waits(backend: BaseLockBackend, name: str) -> Waits | None:
    """Who waits for whom around lock ``name``; None for a backend with no wait edges."""
    if not isinstance(backend, RedisLockBackend):
        return None
    return read_waits(backend.client, name)


class Command(BaseCommand):
    """List, inspect and force-release distributed locks."""

    help = "List, inspect and force-release the locks of an RLOCKS alias."

    def add_arguments(self, parser: CommandParser) -> None:
        """Three actions, each with --using and --json (and Django's standard options)."""
        standard = _standard_options(parser)
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

        def action(name: str, help_text: str) -> CommandParser:
            sub: CommandParser = actions.add_parser(name, help=help_text, description=help_text)
            sub.add_argument(
                "--using", default=DEFAULT_LOCK_ALIAS, help="the RLOCKS alias (default: default)"
            )
            sub.add_argument("--json", action="store_true", help="print JSON for scripts")
            for option in standard:
                _accept(sub, option)
            return sub

        listing = action("list", "List held locks (SCAN, never KEYS).")
        listing.add_argument("pattern", nargs="?", default="*", help="glob over lock names")
        inspecting = action(
            "inspect",
            "Show one lock's holders, hold counts, TTL and token, its waiters and who "
            "waits for whom around it, and the rate limiter of that name while its "
            "permits refill.",
        )
        inspecting.add_argument("name", help="the lock name")
        releasing = action("release", "Delete a lock whoever holds it (needs --force).")
        releasing.add_argument("name", help="the lock name")
        releasing.add_argument(
            "--force", action="store_true", help="required: this breaks the holder's lock"
        )
        releasing.add_argument("--yes", action="store_true", help="do not ask for confirmation")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the chosen action."""
        try:
            backend = locks[options["using"]]
        except LockSettingError as error:
            raise CommandError(str(error)) from None
        try:
            getattr(self, f"_{options['action']}")(backend, options)
        except ValueError as error:  # a bad lock name or pattern
            raise CommandError(str(error)) from None
        except (LockUnavailableError, LockSettingError) as error:  # one line, not a traceback
            raise CommandError(str(error)) from error

    def _emit(self, data: object) -> None:
        self.stdout.write(json.dumps(data, indent=2, sort_keys=True))

    def _list(self, backend: BaseLockBackend, options: dict[str, Any]) -> None:
        infos = [
            info
            for name in sorted(backend.names(options["pattern"]))
            if (info := backend.inspect(name)) is not None  # released since the scan
        ]
        if options["json"]:
            self._emit([_as_json(info) for info in infos])
            return
        if not infos:
            self.stdout.write(f"No held locks match {options['pattern']!r}.")
            return
        rows = [("NAME", "HOLDER", "HELD FOR", "HOLDS", "TTL", "TOKEN")] + [
            (
                info.name,
                info.holder_text(),
                _held_for_text(info),
                str(sum(info.holders.values())),
                _ttl_text(info.ttl),
                "-" if info.token is None else str(info.token),
            )
            for info in infos
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
        for row in rows:
            cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            self.stdout.write("  ".join(cells).rstrip())

    def _inspect(self, backend: BaseLockBackend, options: dict[str, Any]) -> None:
        name = options["name"]
        info = backend.inspect(name)
        waits = None if info is None else _waits(backend, name)  # a free lock has no holder
        limiter = backend.inspect_rate_limiter(name)
        if options["json"]:
            data = {"name": name, "held": False} if info is None else _as_json(info)
            if waits is not None:
                data.update(waits.as_json())
            if limiter is not None:
                data["rate_limiter"] = _limiter_json(limiter)
            self._emit(data)
            return
        self._show_lock(name, info)
        if waits is not None:
            self._show_waits(name, waits)
        if limiter is not None:
            self.stdout.write(f"Rate limiter {name!r}: {limiter.rate}, burst {limiter.burst}.")
            self.stdout.write(f"  available: {limiter.available} of {limiter.burst}")
            self.stdout.write(f"  next in:   {limiter.next_in:.3f}s")
            self.stdout.write(f"  full in:   {limiter.full_in:.3f}s")
            for line in _place_lines(limiter):
                self.stdout.write(line)

    def _show_lock(self, name: str, info: LockInfo | None) -> None:
        if info is None:
            self.stdout.write(f"Lock {name!r} is free.")
            return
        self.stdout.write(f"Lock {name!r} is held.")
        renewal = info.renewal_text()  # a lease's end, or only a watchdog's margin
        self.stdout.write(f"  TTL:    {_ttl_text(info.ttl)}{f' ({renewal})' if renewal else ''}")
        self.stdout.write(f"  token:  {'-' if info.token is None else info.token}")
        for holder, count in info.holders.items():
            self.stdout.write(f"  owner:  {holder} ({count} hold{'s' if count != 1 else ''})")
        if info.holder is not None:
            self.stdout.write(f"  holder: {info.holder_text()}")
            since = info.holder["acquired_at"]
            self.stdout.write(f"  since:  {since} (held for {_held_for_text(info)})")
        self.stdout.write(f"  waiters: {info.waiters}")

    def _show_waits(self, name: str, waits: Waits) -> None:
        """Who has waited for ``name`` past the deadlock check, and what its holder waits for."""
        if waits.waited_by:
            self.stdout.write("  waiting past the deadlock check:")
            for waiter in waits.waited_by:
                self.stdout.write(f"    {waiter.owner} for {waiter.waiting:.1f}s")
        if not waits.holder_waits_for:
            return
        self.stdout.write("  its holder waits for:")
        for step in waits.holder_waits_for:
            if step.owner is None:
                held = "now free"
            else:
                held = f"held by {step.owner}"
                if step.holder is not None:
                    held += f": {LockInfo(step.lock, holder=step.holder).holder_text()}"
            back = ", this lock" if step.lock == name and waits.cycle else ""
            self.stdout.write(f"    lock {step.lock!r} (for {step.waiting:.1f}s{back}), {held}")
        if waits.cycle:
            self.stdout.write(
                "  deadlock: the holder waits, through these locks, for itself; detection "
                "breaks it within RLOCK_DEADLOCK_TIMEOUT (with detection off it waits for ever)"
            )

    def _release(self, backend: BaseLockBackend, options: dict[str, Any]) -> None:
        name = options["name"]
        if not options["force"]:
            raise CommandError(
                "release breaks the lock of whoever holds it; pass --force to do it anyway"
            )
        if not options["yes"]:
            if options["json"]:
                raise CommandError("--json cannot ask for confirmation; add --yes")
            info = backend.inspect(name)
            holder = "nobody" if info is None else info.holder_text()
            self.stdout.write(f"Release lock {name!r} (held by {holder})? [y/N] ", ending="")
            self.stdout.flush()
            answer = sys.stdin.readline().strip().lower()
            if answer not in ("y", "yes"):
                raise CommandError("Not released.")
        released = backend.force_release(name)
        if options["json"]:
            self._emit({"name": name, "released": released})
        elif released:
            self.stdout.write(f"Released lock {name!r}; its holder learns of it as a lost lock.")
        else:
            self.stdout.write(f"Lock {name!r} was not held.")
