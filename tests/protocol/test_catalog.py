"""Every script as a client makes it: which may run when Redis is out of memory, and the
per-client registry that makes each kind's set once, on first use."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_rlock.core._protocol import catalog
from django_rlock.core._protocol.fairlock import FairScripts
from django_rlock.core._protocol.lock import LockScripts, ScriptRegistry
from django_rlock.core._protocol.rwlock import RWScripts
from django_rlock.core._protocol.semaphore import SemaphoreScripts

pytestmark = pytest.mark.pure


class Maker:
    """A script factory that records what it made, tagged with its own name."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.made: list[str] = []

    def __call__(self, body: str) -> tuple[str, str]:
        self.made.append(body)
        return (self.tag, body)


def made_by_kind() -> dict[str, tuple[str, str]]:
    """``"<kind>.<name>"`` -> (``plain`` or ``oom_safe``, body), for every script."""
    found = {}
    for kind, script_set in catalog.KINDS.items():
        made = script_set(Maker("plain"), Maker("oom_safe"))
        for name, (tag, body) in vars(made).items():
            found[f"{kind}.{name}"] = (tag, body)
    return found


MADE = made_by_kind()


def test_the_catalog_lists_every_script_a_kind_makes_as_made() -> None:
    assert {name: body for name, (_, body) in MADE.items()} == catalog.scripts()
    assert len(set(catalog.scripts().values())) >= len(catalog.KINDS) * 2


@pytest.mark.parametrize("name", sorted(MADE))
def test_giving_back_runs_out_of_memory_and_taking_does_not(name: str) -> None:
    """A full server must still let holders release (docs: 'Out of memory')."""
    tag, _ = MADE[name]
    operation = name.split(".", 1)[1]
    if any(word in operation for word in ("release", "abandon", "renew")):
        assert tag == "oom_safe", name
    if "acquire" in operation:
        # It creates keys: refused whole under OOM, before it changes anything.
        assert tag == "plain", name


def test_a_registry_makes_each_kind_once_and_only_when_asked() -> None:
    plain, oom_safe = Maker("plain"), Maker("oom_safe")
    registry = ScriptRegistry(plain, oom_safe)
    assert plain.made == [] and oom_safe.made == []  # nothing made before use
    fair = registry[FairScripts]
    assert registry[FairScripts] is fair
    assert isinstance(fair, FairScripts)
    fair_count = len(plain.made) + len(oom_safe.made)
    assert fair_count == len([name for name in MADE if name.startswith("fairlock.")])
    assert isinstance(registry[LockScripts], LockScripts)
    assert registry[SemaphoreScripts] is not registry[RWScripts]  # type: ignore[comparison-overlap]


def test_the_rendered_files_are_written_and_stale_ones_removed(tmp_path: Path) -> None:
    stale = tmp_path / "lock.gone.lua"
    stale.write_text("-- a script no kind sends any more\n")
    kept = tmp_path / "notes.txt"
    kept.write_text("not a script")
    written = catalog.write(tmp_path)
    assert not stale.exists() and kept.exists()
    assert sorted(path.name for path in written) == sorted(
        f"{name}.lua" for name in catalog.scripts()
    )
    body = (tmp_path / "lock.acquire.lua").read_text()
    assert body.startswith("-- lock.acquire: generated from django_rlock/core/_protocol")
    assert body.endswith(catalog.scripts()["lock.acquire"].strip() + "\n")
