"""Every Python sample in README.md and docs/*.md runs, so none can rot.

How a page is run:

* Its ```` ```python ```` blocks run in order, in one namespace per page, as a
  reader would type them into one interpreter session.
* ``<!-- docs-test ... -->`` comments hold hidden Python, run at their place in
  the page: the setup a sample needs (``charge = ...``) before it, checks of
  what it claims (``assert ...``) after it. Markdown renderers do not show them.
* A ```` ```python ```` block right after ``<!-- docs-excerpt PATH -->`` quotes
  the repository's file ``PATH`` (the example project's code, tested with it):
  it is not run, but must appear in that file verbatim (up to indentation), so
  the quote cannot drift from the code.
* Samples name Redis as ``redis://127.0.0.1:6379``; the test points that
  address at the test suite's redis-server.
* The namespace starts with ``REDIS_URL`` (that server), ``settings``
  (pytest-django's fixture: assignments apply Django settings for the page),
  ``rf`` (Django's RequestFactory) and ``held_elsewhere(name)`` (a context
  manager holding the lock ``name`` of ``locks["default"]`` on another thread).
* A page may create Celery apps; the current app is restored after it, and
  its apps see only the "shared" tasks that existed when the suite was
  collected (Celery binds every shared task defined in the process to every
  app it finalizes, including tests' deliberately broken ones).

A sample that cannot run as shown needs hidden setup, not an exemption: there
is no way to skip a block.
"""

from __future__ import annotations

import re
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery import _state as celery_state
from django.test import RequestFactory
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock.core import LockClient
from django_rlock.handler import locks
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SAMPLE_ADDRESS = "redis://127.0.0.1:6379"

_SHARED_TASKS_AT_COLLECTION = frozenset(celery_state._on_app_finalizers)

_FENCE = re.compile(r"^```python\s*$")
_HIDDEN = re.compile(r"^<!-- docs-test\s*$")
_EXCERPT = re.compile(r"^<!-- docs-excerpt (\S+) -->\s*$")


@dataclass(frozen=True)
class Chunk:
    """One piece of Python of a page: its first line number, source, and kind.

    ``quotes`` is the repository path an excerpt quotes (None: the chunk runs).
    """

    line: int
    source: str
    hidden: bool
    quotes: str | None = None


def chunks(page: Path) -> list[Chunk]:
    """The Python of ``page``, in reading order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    quotes = None
    index = 0
    while index < len(lines):
        line = lines[index]
        excerpt = _EXCERPT.match(line)
        if excerpt:
            quotes = excerpt.group(1)
            index += 1
            continue
        closing = "```" if _FENCE.match(line) else "-->" if _HIDDEN.match(line) else None
        if closing is None:
            if line.strip():
                quotes = None  # an excerpt marker applies to the block right after it
            index += 1
            continue
        start = index + 1
        end = start
        while end < len(lines) and lines[end].strip() != closing:
            end += 1
        if end == len(lines):
            raise AssertionError(f"{page.name}:{index + 1}: block never closed")
        source = "\n".join(lines[start:end])
        found.append(
            Chunk(start + 1, source, closing == "-->", quotes if closing == "```" else None)
        )
        quotes = None
        index = end + 1
    return found


def quoted_in(source: str, path: Path) -> bool:
    """Whether ``source`` appears in the file ``path`` line for line, up to indentation."""
    wanted = textwrap.dedent(source).splitlines()
    lines = path.read_text(encoding="utf-8").splitlines()
    return any(
        textwrap.dedent("\n".join(lines[start : start + len(wanted)])).splitlines() == wanted
        for start in range(len(lines) - len(wanted) + 1)
    )


@contextmanager
def held_elsewhere(name: str) -> Iterator[None]:
    """The lock ``name`` held by another thread (another owner) inside the block."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with locks["default"].lock(name):
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(30), f"could not take {name!r}"
    try:
        yield
    finally:
        done.set()
        thread.join(30)


def run_page(page: Path, namespace: dict[str, Any], server_address: str) -> None:
    for chunk in chunks(page):
        if chunk.quotes is not None:
            quoted = ROOT / chunk.quotes
            assert quoted.is_file(), f"{page.name}:{chunk.line}: no file {chunk.quotes}"
            assert quoted_in(chunk.source, quoted), (
                f"{page.relative_to(ROOT)}:{chunk.line}: the excerpt is not in {chunk.quotes} "
                f"(any more):\n\n{chunk.source}"
            )
            continue
        source = chunk.source.replace(SAMPLE_ADDRESS, server_address)
        # Padded so tracebacks point at the page's own line numbers.
        code = compile("\n" * (chunk.line - 1) + source, str(page), "exec")
        try:
            exec(code, namespace)  # running the docs' samples is the point
        except Exception as error:
            kind = "hidden check" if chunk.hidden else "sample"
            raise AssertionError(
                f"{page.relative_to(ROOT)}:{chunk.line}: the {kind} failed: {error!r}\n\n"
                f"{chunk.source}"
            ) from error


def test_the_readme_and_the_guides_have_samples() -> None:
    assert len(chunks(ROOT / "README.md")) >= 10
    assert chunks(ROOT / "docs" / "django.md") and chunks(ROOT / "docs" / "celery.md")


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_sample_of_the_page_runs(
    page: Path,
    redis_server: RedisServer,
    r: redis.Redis,
    settings: SettingsWrapper,
) -> None:
    address = f"redis://127.0.0.1:{redis_server.port}"
    settings.RLOCKS = {"default": {"LOCATION": f"{address}/0"}}
    namespace: dict[str, Any] = {
        "__name__": f"docs_{page.stem.replace('-', '_')}",
        "REDIS_URL": f"{address}/0",
        "settings": settings,
        "rf": RequestFactory(),
        "held_elsewhere": held_elsewhere,
    }
    default_app, current_app = celery_state.default_app, celery_state.get_current_app()
    shared_tasks = set(celery_state._on_app_finalizers)
    celery_state._on_app_finalizers.clear()
    celery_state._on_app_finalizers.update(_SHARED_TASKS_AT_COLLECTION)
    try:
        run_page(page, namespace, address)
    finally:
        for value in namespace.values():
            if isinstance(value, LockClient | Celery):
                value.close()
        locks.close_all()
        celery_state.set_default_app(default_app)
        celery_state._set_current_app(current_app)
        celery_state._on_app_finalizers.clear()
        celery_state._on_app_finalizers.update(shared_tasks)


def test_an_excerpt_must_match_its_file(tmp_path: Path) -> None:
    quoted = tmp_path / "code.py"
    quoted.write_text("def f():\n    if x:\n        return 1\n")

    assert quoted_in("if x:\n    return 1", quoted)
    assert not quoted_in("if x:\n    return 2", quoted)
    assert not quoted_in("if x:\nreturn 1", quoted)  # indentation inside the quote counts
