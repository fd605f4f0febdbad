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

Ownership (issue 31) is judged from what the owners say, not from what the
library counts. Every owner works inside a :class:`Scope` it announces: a
thread's or an asyncio task's life, a unit of work on a long-lived thread (a
request, a task run: ``work_started``/``work_ended``), a child process whose
main thread returned while a worker thread goes on. What it is granted there
is a :class:`Claim`: from the grant until its owner starts giving back its
last count, or, for a hold taken without a lease, until its scope ends (then
the library may report it leaked and give it back); a hold first taken with a
lease is claimed until the latest end its leases asked for, whatever scope
it was taken in. :meth:`History.check_ownership` finds, outside the windows of
injected faults: a rival granted while another scope's claim on the name was
open (a unit of work re-entering an earlier unit's lease hold is a rival too);
the library reporting leaked (and giving back) a hold whose claim was open;
an owner's own release refused (LockNotOwnedError, LockLostError) while its
claim was open; an acquire that returned True with no hold of the caller's
recorded (the grant went to another owner id, such as a task ``wait_for`` or
``shield`` ran it in).
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
    "OWNERSHIP",
    "PERMITS",
    "RELEASE_OUTCOME",
    "TOKEN_ORDER",
    "UPGRADE",
    "Belief",
    "Claim",
    "DoubleHolder",
    "History",
    "HolderNotTold",
    "Leak",
    "ModelViolation",
    "OwnershipBroken",
    "Revocation",
    "Scope",
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
OWNERSHIP = "a hold ended while its owner was inside the scope that took it"

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


class OwnershipBroken(ModelViolation):
    """A hold was given back, or a rival granted, while its owner's scope still claimed it."""


_ERRORS: dict[str, type[ModelViolation]] = {
    DOUBLE_HOLDER: DoubleHolder,
    TOKEN_ORDER: TokenWentBackwards,
    RELEASE_OUTCOME: WrongReleaseOutcome,
    HOLDER_NOT_TOLD: HolderNotTold,
    LEAK: Leak,
    PERMITS: TooManyPermits,
    UPGRADE: WrongUpgradeOutcome,
    OWNERSHIP: OwnershipBroken,
}

#: The kinds of scope an owner announces (see the module docstring).
THREAD_SCOPE, TASK_SCOPE, UNIT_SCOPE, PROCESS_SCOPE = "thread", "task", "unit of work", "process"


@dataclass(eq=False)
class Scope:
    """One owner's announced unit of ownership, from ``began`` until ``ended``."""

    owner: str
    kind: str
    number: int
    began: float
    ended: float | None = None

    @property
    def label(self) -> str:
        return f"{self.owner} {self.kind} #{self.number}"

    def describe(self) -> str:
        ended = "still open" if self.ended is None else f"ended {self.ended:.3f}"
        return f"{self.label} (began {self.began:.3f}, {ended})"


@dataclass(eq=False)
class Claim:
    """What one scope counts on holding of one name, as its owner keeps the books.

    ``lease_end`` is the latest ``sent + lease`` of its acquisitions with a
    lease (a re-entry never shortens the key's life, and the hold lived until
    each re-entry of it: the server keeps it at least until then); None when
    none had one. ``first_lease`` is the lease of the grant (None: the watchdog's):
    a lease hold stays a lease, so only a watchdog claim ends with its scope.
    """

    scope: Scope
    name: str
    kind: str
    #: How the grant was asked for ("acquire", "wait_for", "shield", "gather", "cycle"...).
    how: str
    sent_at: float
    granted_at: float
    first_lease: float | None
    lease_end: float | None
    count: int = 1
    #: When the owner started giving back its last count.
    released_at: float | None = None
    #: The library's hold of the owner's id, as recorded after the grant (None: no hold).
    hold: Hold | None = None
    #: False for a claim of another process (its library's holds are not visible here).
    in_process: bool = True

    def natural_end(self) -> float:
        """When the claim ends unless its owner gives it back first (inf: not yet known)."""
        ends = [math.inf]
        if self.lease_end is not None:
            ends.append(self.lease_end)
        if self.first_lease is None and self.scope.ended is not None:
            ends.append(self.scope.ended)
        return min(ends)

    def end_by(self, now: float) -> float:
        """When the claim ended, or ``now`` while it is open."""
        ends = [now, self.natural_end()]
        if self.released_at is not None:
            ends.append(self.released_at)
        return min(ends)

    def describe(self) -> str:
        lease = "watchdog" if self.first_lease is None else f"lease {self.first_lease:g}s"
        ends = []
        if self.released_at is not None:
            ends.append(f"release started {self.released_at:.3f}")
        if self.lease_end is not None:
            ends.append(f"lease ends {self.lease_end:.3f}")
        return (
            f"{self.name!r} claimed by {self.scope.describe()} via {self.how} ({lease}, "
            f"count {self.count}): sent {self.sent_at:.3f}, granted {self.granted_at:.3f}"
            + "".join(f", {end}" for end in ends)
        )


@dataclass(frozen=True)
class LeakReport:
    """The library reported ``hold`` leaked at ``at`` (and, by default, gave it back)."""

    at: float
    hold: Hold
    reason: str


@dataclass(frozen=True)
class RefusedRelease:
    """An owner's release of a claimed hold raised ``error`` (LockNotOwnedError, LockLostError)."""

    claim: Claim
    error: str
    started: float
    answered: float


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
    scopes: list[Scope] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    leak_reports: list[LeakReport] = field(default_factory=list)
    refused_releases: list[RefusedRelease] = field(default_factory=list)
    #: When each injected fault was under way: (from, until); until inf for one
    #: whose moment is not known (a lost reply is armed for the next call).
    fault_windows: list[tuple[float, float]] = field(default_factory=list)

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

    def fault(self, kind: str, detail: str = "", lasts: float = 0.0) -> None:
        """Note a fault injected now, under way for ``lasts`` seconds (inf: not known)."""
        now = clock.monotonic()
        with self._lock:
            self.faults[kind] += 1
            self.fault_windows.append((now, now + lasts))
            self.steps.append(f"{clock.monotonic():.3f} fault: {kind} {detail}".rstrip())

    def violated(self, invariant: str, detail: str) -> None:
        with self._lock:
            self.violations.append(Violation(invariant, detail))

    def step(self, text: str) -> None:
        with self._lock:
            self.steps.append(f"{clock.monotonic():.3f} {text}")

    def scope_began(self, owner: str, kind: str, at: float | None = None) -> Scope:
        """``owner`` announces a new scope of ``kind``, from now (or ``at``) on."""
        with self._lock:
            number = sum(1 for scope in self.scopes if scope.owner == owner)
            scope = Scope(owner, kind, number, clock.monotonic() if at is None else at)
            self.scopes.append(scope)
            self.steps.append(f"{scope.began:.3f} {scope.label} began")
        return scope

    def scope_ended(self, scope: Scope, at: float | None = None) -> None:
        """``scope`` ends now (or ``at``): its holds taken without a lease may be given back."""
        at = clock.monotonic() if at is None else at
        with self._lock:
            scope.ended = at
            self.steps.append(f"{at:.3f} {scope.label} ended")

    def claimed(self, claim: Claim) -> None:
        with self._lock:
            self.claims.append(claim)

    def leaked(self, hold: Hold, reason: str) -> None:
        """The library reported ``hold`` leaked (its ``on_leaked`` subscribers are told)."""
        at = clock.monotonic()
        with self._lock:
            self.leak_reports.append(LeakReport(at, hold, reason))
            self.steps.append(f"{at:.3f} library: {hold.name!r} leaked: {reason}")

    def release_refused(self, claim: Claim, error: str, started: float, answered: float) -> None:
        with self._lock:
            self.refused_releases.append(RefusedRelease(claim, error, started, answered))

    def paused(self, since: float, until: float) -> None:
        """No thread of the process ran from ``since`` to ``until`` (a loaded machine, a GC).

        A pause excuses what comes near it as an injected fault does: renewals
        were late, a hold may have expired.
        """
        with self._lock:
            self.operations["process paused (scheduling lag)"] += 1
            self.fault_windows.append((since, until))
            self.steps.append(f"{until:.3f} process paused {1000 * (until - since):.0f} ms")

    def fault_near(self, since: float, until: float, margin: float) -> bool:
        """Whether an injected fault (or a pause) was under way between ``since`` and ``until``.

        A fault's effects outlast it by up to ``margin`` (a grant whose reply
        was lost lives its lease; a hold unrenewed under a partition is
        declared lost a watchdog timeout later).
        """
        with self._lock:
            windows = list(self.fault_windows)
        return any(start < until and end + margin > since for start, end in windows)

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

    def check_ownership(self, margin: float) -> list[Violation]:
        """Holds ended while their scope claimed them (new ones only; see the module docstring).

        ``margin`` is how long a fault's effects may outlast it.
        """
        now = clock.monotonic()
        with self._lock:
            claims = list(self.claims)
            reports = list(self.leak_reports)
            refusals = list(self.refused_releases)
        found = []
        for claim in claims:
            if (
                claim.in_process
                and claim.hold is None
                and not self.fault_near(claim.sent_at, claim.granted_at, margin)
            ):
                found += self._report_once(
                    (OWNERSHIP, "orphan", id(claim)),
                    OWNERSHIP,
                    f"acquire returned True but the library recorded no hold of the caller: "
                    f"[{claim.describe()}] (the grant went to another owner id)",
                )
        found += self._check_rivals(claims, now, margin)
        for report in reports:
            for claim in claims:
                if claim.hold is not report.hold:
                    continue
                if claim.sent_at <= report.at < claim.end_by(now) and not self.fault_near(
                    claim.sent_at, report.at, margin
                ):
                    found += self._report_once(
                        (OWNERSHIP, "leak", id(report), id(claim)),
                        OWNERSHIP,
                        f"the library reported leaked at {report.at:.3f} ({report.reason}) "
                        f"a hold its owner still claimed: [{claim.describe()}]",
                    )
        for refusal in refusals:
            claim = refusal.claim
            if claim.released_at is not None and claim.released_at < refusal.started:
                continue  # given back before this call: a release too many
            open_until = claim.natural_end()
            if refusal.answered < open_until and not self.fault_near(
                claim.sent_at, refusal.answered, margin
            ):
                found += self._report_once(
                    (OWNERSHIP, "refused", id(refusal)),
                    OWNERSHIP,
                    f"{claim.scope.owner}'s release raised {refusal.error} "
                    f"(started {refusal.started:.3f}) while it claimed the hold: "
                    f"[{claim.describe()}]",
                )
        return found

    def _check_rivals(self, claims: list[Claim], now: float, margin: float) -> list[Violation]:
        """A claim granted while another scope's exclusive claim on its name was open."""
        by_name: dict[str, list[Claim]] = {}
        for claim in claims:
            if claim.kind != PERMIT:
                by_name.setdefault(claim.name, []).append(claim)
        found = []
        for same_name in by_name.values():
            same_name.sort(key=lambda claim: claim.granted_at)
            for index, first in enumerate(same_name):
                first_end = first.end_by(now)
                for second in same_name[index + 1 :]:
                    if second.granted_at >= first_end:
                        continue
                    if second.scope is first.scope or first.kind == second.kind == READ:
                        continue
                    since = min(first.sent_at, second.sent_at)
                    if self.fault_near(since, second.granted_at, margin):
                        continue
                    found += self._report_once(
                        (OWNERSHIP, "rival", id(first), id(second)),
                        OWNERSHIP,
                        f"{second.scope.label} was granted {first.name!r} at "
                        f"{second.granted_at:.3f} while [{first.describe()}] was open"
                        + self._leaks_of(first),
                    )
        return found

    def _leaks_of(self, claim: Claim) -> str:
        """The library's leak reports of ``claim``'s hold, for a violation's report."""
        with self._lock:
            reports = [report for report in self.leak_reports if report.hold is claim.hold]
        return "".join(
            f"; the library reported it leaked at {report.at:.3f}: {report.reason}"
            for report in reports
        )

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
