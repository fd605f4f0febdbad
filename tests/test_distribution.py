"""The suite tests what users install: the wheel, with every module of the source tree.

``make test`` (noxfile.py) installs the built wheel into a fresh virtualenv and runs
this suite from a copy of the test tree, with ``RLOCK_SOURCE_TREE`` naming the
checkout the wheel was built from.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

import celery_rlock
import django_rlock

PACKAGES = ("django_rlock", "celery_rlock")


def source_tree() -> Path:
    value = os.environ.get("RLOCK_SOURCE_TREE")
    if not value:
        pytest.fail("RLOCK_SOURCE_TREE is not set: run the suite with `make test` (noxfile.py)")
    return Path(value)


def installed_files() -> set[str]:
    files = metadata.files("django-rlock") or []
    return {file.as_posix() for file in files}


def test_the_packages_under_test_are_the_installed_ones_not_the_source_tree() -> None:
    tree = source_tree().resolve()
    for package in (django_rlock, celery_rlock):
        location = Path(package.__file__ or "").resolve().parent
        assert location != tree / package.__name__, f"{package.__name__} comes from the source tree"
        assert "site-packages" in location.parts


def test_every_module_and_marker_of_the_source_tree_is_in_the_wheel() -> None:
    tree = source_tree()
    wanted = {
        path.relative_to(tree).as_posix()
        for package in PACKAGES
        for path in (tree / package).rglob("*")
        if path.suffix in (".py", ".html") or path.name == "py.typed"
        if "__pycache__" not in path.parts
    }
    assert len(wanted) > 40  # the tree was found, not an empty folder
    missing = sorted(wanted - installed_files())
    assert not missing, f"in the source tree but not in the wheel: {missing}"


def test_the_wheel_carries_the_license_and_metadata_users_see() -> None:
    files = installed_files()
    assert any(
        name.endswith(".dist-info/licenses/LICENSE") or name.endswith(".dist-info/LICENSE")
        for name in files
    )
    meta = metadata.metadata("django-rlock")
    assert meta["Version"] == django_rlock.__version__
    assert "Framework :: Django" in (meta.get_all("Classifier") or [])
    assert meta.get_all("Project-URL")


def test_the_readme_links_work_on_a_package_index() -> None:
    # README.md is the long description: on a package index a relative link (a docs
    # page, an in-page anchor) leads nowhere, so every link is absolute.
    readme = (source_tree() / "README.md").read_text()
    relative = re.findall(r"\]\((?!https?://)([^)]*)\)", readme)
    assert not relative, f"README.md links that only work inside the repository: {relative}"
