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
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from django_rlock.core import clock
from django_rlock.core.hold import Hold

__all__ = [
    "DOUBLE_HOLDER",
    "HOLDER_NOT_TOLD",
    "LEAK",
    "RELEASE_OUTCOME",
    "TOKEN_ORDER",
    "Belief",
    "DoubleHolder",
    "History",
    "HolderNotTold",
    "Leak",
    "ModelViolation",
    "Revocation",
    "TokenWentBackwards",
    "Violation",
    "WrongReleaseOutcome",
]

DOUBLE_HOLDER = "two owners believed they held"
TOKEN_ORDER = "fencing token did not increase"
RELEASE_OUTCOME = "wrong release outcome"
HOLDER_NOT_TOLD = "holder not told its hold ended"
LEAK = "something grew"


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


_ERRORS: dict[str, type[ModelViolation]] = {
    DOUBLE_HOLDER: DoubleHolder,
    TOKEN_ORDER: TokenWentBackwards,
    RELEASE_OUTCOME: WrongReleaseOutcome,
    HOLDER_NOT_TOLD: HolderNotTold,
    LEAK: Leak,
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

    def re_entered_by(self, later: Belief, now: float) -> bool:
        """Whether ``later`` re-entered this grant: the same owner and token, asked for
        while this one was still believed (through another client: owner ids are per
        thread or task, so a closed client's fixed-lease hold is still the owner's)."""
        if later.owner != self.owner or later.token != self.token:
            return False
        end = self.end_by(now)
        return end is not None and end > later.sent_at

    def describe(self) -> str:
        ended = []
        if self.released_at is not None:
            ended.append(f"release started {self.released_at:.3f}")
        if self.lost_at is not None:
            ended.append(f"declared lost {self.lost_at:.3f}")
        ended.append(f"deadline {self.hold.deadline:.3f}")
        return (
            f"{self.owner} token {self.token} ({'watchdog' if self.hold.watchdog else 'lease'}): "
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
        if self.names is not None and belief.name not in self.names:
            return False
        end = belief.end_by(now)
        return belief.sent_at < self.answered and (end is None or end > self.sent)


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
    _reported: set[tuple[int, int, str]] = field(default_factory=set)

    def granted(self, owner: str, hold: Hold, granted_at: float) -> Belief:
        """Record a new grant (the caller checked it is not a re-entry)."""
        belief = Belief(
            owner=owner,
            name=hold.name,
            token=hold.token,
            hold=hold,
            sent_at=hold.acquired_at,
            granted_at=granted_at,
        )
        with self._lock:
            self.beliefs.append(belief)
            self._by_hold[id(hold)] = belief
        return belief

    def belief_of(self, hold: Hold) -> Belief | None:
        with self._lock:
            belief = self._by_hold.get(id(hold))
        return belief if belief is not None and belief.hold is hold else None

    def declaring_lost(self, hold: Hold, at: float) -> None:
        """The library is about to declare ``hold`` lost (called before the flag is set)."""
        belief = self.belief_of(hold)
        if belief is not None and (belief.lost_at is None or at < belief.lost_at):
            belief.lost_at = at

    def revoked(self, revocation: Revocation) -> None:
        with self._lock:
            self.revocations.append(revocation)

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

        Except a re-entry of a grant its owner still believed in (:meth:`Belief.re_entered_by`).
        """
        now = clock.monotonic()
        with self._lock:
            beliefs = list(self.beliefs)
        by_name: dict[str, list[Belief]] = {}
        for belief in beliefs:
            by_name.setdefault(belief.name, []).append(belief)
        found = []
        for grants in by_name.values():
            grants.sort(key=lambda belief: belief.granted_at)
            for later in grants:
                earlier = [
                    belief
                    for belief in grants
                    if belief.granted_at < later.sent_at
                    and belief.token >= later.token
                    and not belief.re_entered_by(later, now)
                ]
                if earlier:
                    first = max(earlier, key=lambda belief: belief.token)
                    found += self._report(
                        first,
                        later,
                        TOKEN_ORDER,
                        f"{later.name!r}: [{first.describe()}] was granted before "
                        f"[{later.describe()}] was asked for",
                    )
        return found

    def _report(
        self, first: Belief, second: Belief, invariant: str, detail: str
    ) -> list[Violation]:
        seen = (id(first), id(second), invariant)
        with self._lock:
            if seen in self._reported:
                return []
            self._reported.add(seen)
            violation = Violation(invariant, detail)
            self.violations.append(violation)
        return [violation]
