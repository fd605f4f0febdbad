"""docs/lua holds every script exactly as a client sends it: none stale, none missing, none extra.

The files are rendered by ``django_rlock/core/_protocol/catalog.py``; ``make lua``
writes them again. They are found beside this file (``parents[2]``), so the
suite also checks them from its staged copy (noxfile.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from django_rlock.core._protocol import catalog

LUA = Path(__file__).resolve().parents[2] / "docs" / "lua"

#: Every script a lock kind sends, by name.
SCRIPTS = catalog.scripts()

REGENERATE = "run `make lua` to write docs/lua again, and commit it"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_script_has_its_file_as_sent(name: str) -> None:
    path = LUA / f"{name}.lua"
    assert path.is_file(), f"docs/lua/{path.name} is missing: {REGENERATE}"
    assert path.read_text() == catalog.render(name, SCRIPTS[name]), (
        f"docs/lua/{path.name} is stale: {REGENERATE}"
    )


def test_no_file_is_left_without_its_script() -> None:
    extra = sorted(path.name for path in LUA.glob("*.lua") if path.stem not in SCRIPTS)
    assert not extra, f"docs/lua has files no kind sends any more, {extra}: {REGENERATE}"
