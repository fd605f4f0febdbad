"""What the process floor reads of a hold and of the registry keeping it, as structural types.

The holds themselves are recorded by :mod:`django_rlock.core._protocol.holds`
(``Hold``, ``HoldRegistry``), a floor above this one: the leak reports
(:mod:`~django_rlock.core._process.leaks`) and the lock order check
(:mod:`~django_rlock.core._process.lockorder`) read them through these
protocols, so ``_process`` imports nothing above it. ``HoldRegistry``
hands this floor its registries at import (:func:`leaks.keepers_from
<django_rlock.core._process.leaks.keepers_from>`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol


class KeptLock(Protocol):
    """A lock object holding a hold, as ``_protocol/holds.py``'s ``HeldLock`` is."""

    #: The key template the lock was made from (its lock class), if known.
    key_template: str | None

    def give_back_leaked(self, hold: Any) -> None:
        """Release every hold ``hold``'s owner counts (a leaked hold's way back)."""
        ...


class KeptHold(Protocol):
    """One hold, as ``_protocol/holds.py``'s ``Hold`` records it."""

    name: str
    owner: str
    lost: bool
    released: bool

    @property
    def locks(self) -> Sequence[KeptLock]:
        """The lock objects holding it."""
        ...


class HoldKeeper(Protocol):
    """A registry of holds, as ``_protocol/holds.py``'s ``HoldRegistry`` is (one per client)."""

    #: Whether a leaked hold is given back (True) or left to expire.
    release_leaked: bool

    def keeps(self, hold: Any) -> bool:
        """Whether this registry keeps ``hold``."""
        ...

    def report_leaked(self, hold: Any, reason: str) -> bool:
        """Report ``hold`` leaked for ``reason``; False when it was reported or gone already."""
        ...

    def forget_holds(self, holds: list[Any]) -> None:
        """Stop keeping ``holds`` (left to expire, or to their lease)."""
        ...

    def owns_any(self, owner: str) -> bool:
        """Whether ``owner`` has a hold here."""
        ...

    def holds_owned_by(self, owner: str) -> list[Any]:
        """The holds ``owner`` has here."""
        ...

    def on_acquired(self, callback: Callable[[Any], object]) -> None:
        """Call ``callback`` with each new hold this registry grants."""
        ...
