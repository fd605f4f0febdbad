"""The history of a model run, and the checks that read it (Jepsen-style).

Every hold an owner is granted becomes a :class:`Belief`: the interval during
which its owner believes it holds the lock, seen from the owner's own clock.
It starts when ``acquire`` returned (the owner cannot believe earlier) and
ends at the earliest of: the owner starting its final release, the library
starting to declare the hold lost, and the hold's local deadline (which the
library computes and renewals push forward). Every end is taken at or before
the true moment, so a belief is never recorded longer than it was: an overlap
found here happened.

Why two overlapping beliefs are a bug whatever the order of the grants: both
owners were granted by the time the later ``acquire`` returned, and each
believed past that instant; whichever was granted first therefore believed
while the server had already given its lock to the other. Only faults that
take a lock away on the server (an operator's force-release, FLUSHALL, a
restart without persistence) excuse that: a :class:`Revocation` excuses every
belief it may have hit. Fencing tokens have no excuse: they must grow across
grants of one name even when Redis forgets the counter (DESIGN.md, Fencing).

The sibling kinds keep the same belief rules with their own invariants, each
belief carrying its :data:`Belief.kind`: a read-write lock's write belief
overlaps no other owner's read or write belief of its name (reads overlap
freely; an owner's own read while it writes is allowed), and only write grants
carry tokens; a semaphore's permit beliefs of one name never add up to more
than its permits at one instant (an owner's re-entry is one more permit, a
release ends one from the moment it starts), and carry no tokens.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from django_rlock.core._protocol import clock
from django_rlock.core._protocol.holds import Hold

__all__ = [
    "DOUBLE_HOLDER",
    "HOLDER_NOT_TOLD",
    "LEAK",
    "PERMITS",
    "RELEASE_OUTCOME",
    "TOKEN_ORDER",
    "UPGRADE",
    "Belief",
    "DoubleHolder",
    "History",
    "HolderNotTold",
    "Leak",
    "ModelViolation",
    "Revocation",
    "TokenWentBackwards",
    "TooManyPermits",
    "Violation",
    "WrongReleaseOutcome",
    "WrongUpgradeOutcome",
]

DOUBLE_HOLDER = "two owners believed they held"
TOKEN_ORDER = "fencing token did not increase"
RELEASE_OUTCOME = "wrong release outcome"
HOLDER_NOT_TOLD = "holder not told its hold ended"
LEAK = "something grew"
PERMITS = "more permits believed than the semaphore has"
UPGRADE = "wrong outcome of a reader asking to write"

#: The kinds of belief: a lock's hold, a semaphore's permits, a read-write lock's sides.
LOCK, PERMIT, READ, WRITE = "lock", "permit", "read", "write"
#: The kinds whose grants carry fencing tokens.
FENCED = frozenset({LOCK, WRITE})


class ModelViolation(AssertionError):
    """An invariant of the model failed; each invariant has its own subclass."""


class DoubleHolder(ModelViolation):
    """Two owners believed they held one name at one instant."""


class TokenWentBackwards(ModelViolation):
    """A later grant of a name got a token not above an earlier one's."""


class WrongReleaseOutcome(ModelViolation):
    """A release raised what it must not (or did not raise what it must)."""


class HolderNotTold(ModelViolation):
    """A hold ended without its owner being told (``lock.lost`` stayed false)."""


class Leak(ModelViolation):
    """Connections, threads, keys or channels were left behind."""


class TooManyPermits(ModelViolation):
    """Owners believed they held more permits of one semaphore than it has, at one instant."""


class WrongUpgradeOutcome(ModelViolation):
    """A reader asking to write was granted, or an owner reading nothing was refused as one."""


_ERRORS: dict[str, type[ModelViolation]] = {
    DOUBLE_HOLDER: DoubleHolder,
    TOKEN_ORDER: TokenWentBackwards,
    RELEASE_OUTCOME: WrongReleaseOutcome,
    HOLDER_NOT_TOLD: HolderNotTold,
    LEAK: Leak,
    PERMITS: TooManyPermits,
    UPGRADE: WrongUpgradeOutcome,
}


@dataclass(eq=False)
class Belief:
    """One grant to one owner, from ``granted_at`` until its owner stops believing."""

    owner: str
    name: str
    token: int
    hold: Hold
    #: When the granting call was sent (the grant happened after it).
    sent_at: float
    #: When ``acquire`` returned to the owner.
    granted_at: float
    #: When the owner started the release that ended the hold.
    released_at: float | None = None
    #: When the library started declaring the hold lost (just before the flag is set).
    lost_at: float | None = None
    #: What was granted: LOCK, PERMIT, READ or WRITE.
    kind: str = LOCK
    #: For PERMIT: (from when, how many permits the owner believed it held), in time order.
    counts: list[tuple[float, int]] = field(default_factory=list)
    #: The replies that set the hold's deadline (grant and re-entries): (sent, PTTL ms, holds).
    #: Shown in a violation's report, so the deadline can be checked against its replies.
    replies: list[tuple[float, int, int]] = field(default_factory=list)

    def end_by(self, now: float) -> float | None:
        """A time the belief lasted at least until, as seen at ``now``; None: unknown yet.

        Read ``now`` before calling: the hold's flags are read after it, so a
        flag still clear here was clear at ``now``.
        """
        ends = [self.hold.deadline]
        ends += [when for when in (self.released_at, self.lost_at) if when is not None]
        end = min(ends)
        if end <= now:
            return end
        if self.hold.lost or self.hold.released:
            # Ended before this read, but the moment is not recorded yet: ask later.
            return None if self.lost_at is None and self.released_at is None else end
        return now

    def describe(self) -> str:
        ended = []
        if self.released_at is not None:
            ended.append(f"release started {self.released_at:.3f}")
        if self.lost_at is not None:
            ended.append(f"declared lost {self.lost_at:.3f}")
        ended.append(f"deadline {self.hold.deadline:.3f}")
        if len(self.replies) > 1:
            ended.append(
                "replies "
                + ", ".join(
                    f"sent {sent:.3f} pttl {pttl_ms} ms holds {holds}"
                    for sent, pttl_ms, holds in list(self.replies)[-3:]
                )
            )
        what = f"{self.kind} token {self.token}" if self.kind != LOCK else f"token {self.token}"
        if self.kind == PERMIT:
            what = "permits " + ",".join(f"{count}@{at:.3f}" for at, count in list(self.counts))
        return (
            f"{self.owner} {what} ({'watchdog' if self.hold.watchdog else 'lease'}): "
            f"sent {self.sent_at:.3f}, granted {self.granted_at:.3f}, " + ", ".join(ended)
        )


@dataclass(frozen=True)
class Revocation:
    """A fault that took locks away on the server between ``sent`` and ``answered``."""

    kind: str
    #: The names it hit; None: every name (FLUSHALL, restart).
    names: frozenset[str] | None
    sent: float
    answered: float

    def may_have_hit(self, belief: Belief, now: float) -> bool:
        end = belief.end_by(now)
        return self.may_have_taken(belief.name, belief.sent_at, math.inf if end is None else end)

    def may_have_taken(self, name: str, since: float, until: float) -> bool:
        """Whether it may have taken ``name`` away on the server between ``since`` and ``until``."""
        if self.names is not None and name not in self.names:
            return False
        return since < self.answered and until > self.sent


@dataclass(frozen=True)
class Violation:
    """One broken invariant, with what is needed to understand it."""

    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.detail}"

    def error(self, others: list[Violation]) -> ModelViolation:
        """The exception for this violation, listing ``others`` found with it."""
        lines = [str(self), *(f"also {other}" for other in others if other is not self)]
        return _ERRORS[self.invariant]("\n".join(lines))


@dataclass
class History:
    """Everything the owners and the fault injector recorded in one run (thread-safe)."""

    beliefs: list[Belief] = field(default_factory=list)
    revocations: list[Revocation] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    #: Operations by outcome ("acquire granted", "release LockLostError"...).
    operations: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    #: The steps taken so far, as the machine's rules were called.
    steps: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _by_hold: dict[int, Belief] = field(default_factory=dict)
    _replies: dict[int, list[tuple[float, int, int]]] = field(default_factory=dict)
    _reported: set[tuple[object, ...]] = field(default_factory=set)

    def granted(
        self, owner: str, hold: Hold, granted_at: float, kind: str = LOCK, name: str = ""
    ) -> Belief:
        """Record a new grant (the caller checked it is not a re-entry) of ``name`` (the hold's)."""
        belief = Belief(
            owner=owner,
            name=name or hold.name,
            token=hold.token,
            hold=hold,
            sent_at=hold.acquired_at,
            granted_at=granted_at,
            kind=kind,
            counts=[(granted_at, hold.count)],
            replies=list(self._replies.pop(id(hold), [])),
        )
        with self._lock:
            self.beliefs.append(belief)
            self._by_hold[id(hold)] = belief
        return belief

    def reply(self, hold: Hold, sent_at: float, pttl_ms: int, holds: int) -> None:
        """An acquire reply that granted or re-entered ``hold`` (before its belief, if new)."""
        with self._lock:
            belief = self._by_hold.get(id(hold))
            if belief is not None and belief.hold is hold:
                belief.replies.append((sent_at, pttl_ms, holds))
            else:
                self._replies[id(hold)] = [(sent_at, pttl_ms, holds)]

    def belief_of(self, hold: Hold) -> Belief | None:
        with self._lock:
            belief = self._by_hold.get(id(hold))
        return belief if belief is not None and belief.hold is hold else None

    def released_elsewhere(self, owner: str, name: str, kind: str, at: float) -> None:
        """``owner`` released ``name`` holding nothing in its client: its older beliefs end.

        Such a belief is of a hold its closed client got, which its new client
        knows nothing of, and which the release may just have given back.
        """
        with self._lock:
            beliefs = [
                belief
                for belief in self.beliefs
                if belief.owner == owner and belief.name == name and belief.kind == kind
            ]
        for belief in beliefs:
            if belief.released_at is None:
                belief.released_at = at

    def declaring_lost(self, hold: Hold, at: float) -> None:
        """The library is about to declare ``hold`` lost (called before the flag is set)."""
        belief = self.belief_of(hold)
        if belief is not None and (belief.lost_at is None or at < belief.lost_at):
            belief.lost_at = at

    @contextlib.contextmanager
    def revoking(self, kind: str, names: frozenset[str] | None) -> Iterator[None]:
        """Around a fault that takes locks away on the server: it excuses from when it is sent.

        An owner racing the fault (a release finding its hold gone) may be
        checked before the fault's call returns, so the revocation counts as
        open-ended until then, and as ``sent``..``answered`` after.
        """
        sent = clock.monotonic()
        pending = Revocation(kind, names, sent, math.inf)
        with self._lock:
            self.revocations.append(pending)
        try:
            yield
        finally:
            with self._lock:
                index = next(i for i, known in enumerate(self.revocations) if known is pending)
                self.revocations[index] = Revocation(kind, names, sent, clock.monotonic())

    def operation(self, outcome: str) -> None:
        with self._lock:
            self.operations[outcome] += 1

    def fault(self, kind: str, detail: str = "") -> None:
        with self._lock:
            self.faults[kind] += 1
            self.steps.append(f"{clock.monotonic():.3f} fault: {kind} {detail}".rstrip())

    def violated(self, invariant: str, detail: str) -> None:
        with self._lock:
            self.violations.append(Violation(invariant, detail))

    def step(self, text: str) -> None:
        with self._lock:
            self.steps.append(f"{clock.monotonic():.3f} {text}")

    def raise_first(self) -> None:
        """Raise the first violation recorded (its own ModelViolation subclass), if any."""
        with self._lock:
            violations = list(self.violations)
            steps = list(self.steps)
        if violations:
            error = violations[0].error(violations)
            if steps:
                error.args = (f"{error.args[0]}\nafter these steps:\n  " + "\n  ".join(steps),)
            raise error

    def revoked(self, name: str, since: float, until: float) -> bool:
        """Whether a revocation may have taken ``name`` away between ``since`` and ``until``."""
        return any(
            revocation.may_have_taken(name, since, until) for revocation in list(self.revocations)
        )

    def excused(self, belief: Belief, now: float) -> bool:
        """Whether a revocation may have taken ``belief``'s lock away on the server."""
        return any(revocation.may_have_hit(belief, now) for revocation in list(self.revocations))

    # -- the checks ------------------------------------------------------------------

    def check_overlaps(self) -> list[Violation]:
        """Two owners who both believed they held one name at one instant (new ones only)."""
        now = clock.monotonic()
        with self._lock:
            beliefs = list(self.beliefs)
        by_name: dict[str, list[tuple[Belief, float]]] = {}
        for belief in beliefs:
            if belief.kind == PERMIT:
                continue  # permits are counted (check_permits), not exclusive
            end = belief.end_by(now)
            if end is not None and end > belief.granted_at:
                by_name.setdefault(belief.name, []).append((belief, end))
        found = []
        for intervals in by_name.values():
            intervals.sort(key=lambda item: item[0].granted_at)
            for index, (first, first_end) in enumerate(intervals):
                for second, second_end in intervals[index + 1 :]:
                    if second.granted_at >= first_end:
                        continue  # sorted by start: later ones may still overlap
                    if second.owner == first.owner:
                        continue
                    if first.kind == second.kind == READ:
                        continue  # readers share
                    both_until = min(first_end, second_end)
                    if both_until <= second.granted_at:
                        continue
                    if self.excused(first, now) or self.excused(second, now):
                        continue
                    found += self._report(
                        first,
                        second,
                        DOUBLE_HOLDER,
                        f"{first.name!r} for {1000 * (both_until - second.granted_at):.1f} ms: "
                        f"[{first.describe()}] and [{second.describe()}]",
                    )
        return found

    def check_tokens(self) -> list[Violation]:
        """A grant whose token is not above every grant made before it was asked for.

        A belief of the same owner with the same token is no grant when the
        server re-entered the owner's grant: an owner whose client was closed
        under a live hold asks again through its new client, which knows
        nothing of the hold, so the new client records a hold of its own; or
        the library declared the owner's hold lost (early, by its margin) while
        a re-entry was on its way. Every fresh grant draws a new token, so the
        owner's beliefs with one token are one grant on the server: if any of
        them was alive when the later call was sent, the server still had that
        grant, however many clients it went through (a belief two closes back
        may have ended long before). An owner told its hold is gone asks anew
        and must get a new token: a call sent after every belief of its grant
        ended is checked as a new grant.
        """
        now = clock.monotonic()
        with self._lock:
            beliefs = list(self.beliefs)
        by_name: dict[str, list[Belief]] = {}
        for belief in beliefs:
            if belief.kind in FENCED:  # permits and reads carry no token
                by_name.setdefault(belief.name, []).append(belief)
        found = []
        for grants in by_name.values():
            grants.sort(key=lambda belief: belief.granted_at)
            for later in grants:
                rejoined = _rejoined(grants, later, now)
                earlier = [
                    belief
                    for belief in grants
                    if belief.granted_at < later.sent_at
                    and belief.token >= later.token
                    and not (rejoined and _same_grant(belief, later))
                ]
                if earlier:
                    first = max(earlier, key=lambda belief: belief.token)
                    # The owner's other beliefs in that grant: one alive would have excused it.
                    same = [
                        belief.describe()
                        for belief in grants
                        if _same_grant(belief, later) and belief is not first
                    ]
                    found += self._report(
                        first,
                        later,
                        TOKEN_ORDER,
                        f"{later.name!r}: [{first.describe()}] was granted before "
                        f"[{later.describe()}] was asked for"
                        + (f"; the owner's other beliefs of that token: {same}" if same else ""),
                    )
        return found

    def check_permits(self, permits: int) -> list[Violation]:
        """An instant at which owners believed more than ``permits`` permits of one name."""
        now = clock.monotonic()
        with self._lock:
            beliefs = [belief for belief in self.beliefs if belief.kind == PERMIT]
        # Per name, (when, change in permits believed, whose) as each count starts and ends.
        changes: dict[str, list[tuple[float, int, Belief]]] = {}
        for belief in beliefs:
            end = belief.end_by(now)
            if end is None or end <= belief.granted_at or self.excused(belief, now):
                continue
            steps = list(belief.counts)
            for index, (start, count) in enumerate(steps):
                until = min(end, steps[index + 1][0]) if index + 1 < len(steps) else end
                if count > 0 and until > start:
                    changes.setdefault(belief.name, []).append((start, count, belief))
                    changes[belief.name].append((until, -count, belief))
        found = []
        for name, timeline in changes.items():
            # At one instant, ends before starts: a permit handed over is not two.
            timeline.sort(key=lambda change: (change[0], change[1]))
            holding: dict[int, tuple[Belief, int]] = {}
            for when, change, belief in timeline:
                if change > 0:
                    holding[id(belief)] = (belief, change)
                else:
                    holding.pop(id(belief), None)  # its next count, if any, starts now
                believed = _permits_believed(holding.values())
                if believed > permits:
                    found += self._report_once(
                        (PERMITS, *sorted(holding)),
                        PERMITS,
                        f"{name!r}: {believed} permits believed at {when:.3f} (the semaphore "
                        f"has {permits}): "
                        + "; ".join(f"[{held.describe()}]" for held, _ in holding.values()),
                    )
        return found

    def _report(
        self, first: Belief, second: Belief, invariant: str, detail: str
    ) -> list[Violation]:
        return self._report_once((id(first), id(second), invariant), invariant, detail)

    def _report_once(
        self, seen: tuple[object, ...], invariant: str, detail: str
    ) -> list[Violation]:
        with self._lock:
            if seen in self._reported:
                return []
            self._reported.add(seen)
            violation = Violation(invariant, detail)
            self.violations.append(violation)
        return [violation]


def _same_grant(belief: Belief, later: Belief) -> bool:
    """Whether ``belief`` and ``later`` are one owner's beliefs in one grant (one token)."""
    return belief is not later and belief.owner == later.owner and belief.token == later.token


def _rejoined(grants: list[Belief], later: Belief, now: float) -> bool:
    """Whether ``later`` re-entered a grant its owner still believed in when asking."""
    for belief in grants:
        if _same_grant(belief, later) and belief.granted_at < later.granted_at:
            end = belief.end_by(now)
            if end is None or later.sent_at < end:
                return True
    return False


def _permits_believed(holding: Iterable[tuple[Belief, int]]) -> int:
    """The permits owners believe they hold, from each live belief and its count now.

    An owner's permits of one name are one count on the server (its permit
    hash), which each of its beliefs reads: a belief its new client got after
    the old one was closed already counts the old one's. So an owner believes
    the most any one of its beliefs says, not their sum.
    """
    most: dict[str, int] = {}
    for belief, count in holding:
        most[belief.owner] = max(most.get(belief.owner, 0), count)
    return sum(most.values())
