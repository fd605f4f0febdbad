"""Every Python sample in README.md and docs/*.md runs, each on its own, so none can rot.

Sybil finds the samples; this module decides how they run. The rules:

* A ```` ```python ```` block (a *sample*) runs in a namespace of its own, as a
  reader pasting it into a fresh file would run it: only the fixture names below
  and what the hidden setup before it provides. A sample that needs an import or
  a name from an earlier sample fails with ``NameError``.
* ``<!-- invisible-code-block: python ... -->`` comments (Sybil's hidden blocks,
  which Markdown renderers do not show) run at their place in the namespace of
  the sample before them, so they can check what it claims (``assert ...``).
  The names they bind at top level are also given to the next sample: its
  setup (``paused = paused`` hands on a name of the sample before).
* A block whose first line is ``# path/to/name.py`` is that file: it runs as the
  module ``path.to.name`` (``__name__`` and ``__package__`` set, registered in
  ``sys.modules`` until the page ends), so a later sample imports from it as a
  project would (``from proj.celery import app``). Hidden blocks can be files
  too (``# orders/payments.py``), giving samples something real to import.
* A ```` ```python ```` block right after ``<!-- docs-excerpt PATH -->`` quotes
  the repository's file ``PATH`` (the example project's code, tested with it):
  it is not run, but must appear in that file verbatim (up to indentation), so
  the quote cannot drift from the code.
* Samples name Redis as ``redis://127.0.0.1:6379``; the test points that
  address at the test suite's redis-server.
* The fixture names are ``REDIS_URL`` (that server), ``settings``
  (pytest-django's fixture: assignments apply Django settings for the page),
  ``rf`` (Django's RequestFactory) and ``held_elsewhere(name)`` (a context
  manager holding the lock ``name`` of ``locks["default"]`` on another thread).
* A page may create Celery apps; they and its lock clients are closed after it,
  the current app is restored, and its apps see only the "shared" tasks that
  existed when the suite was collected (Celery binds every shared task defined
  in the process to every app it finalizes, including tests' deliberately
  broken ones).

A sample that cannot run as shown needs hidden setup, not an exemption: there
is no way to skip a block. Pages are found beside this file (``parents[2]``),
not through the installed package, so the suite runs from a copy of the tree.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
import threading
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery import _state as celery_state
from django.test import RequestFactory
from pytest_django.fixtures import Settings as SettingsWrapper
from sybil import Document, Example, Region
from sybil.evaluators.python import pad
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, FencedCodeBlockLexer

from django_rlock._handler import locks
from django_rlock.core import LockClient
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SAMPLE_ADDRESS = "redis://127.0.0.1:6379"

_SHARED_TASKS_AT_COLLECTION = frozenset(celery_state._on_app_finalizers)

_EXCERPT = re.compile(r"<!-- docs-excerpt (\S+) -->[ \t]*\n\s*\Z")
_FILE = re.compile(r"\A# ((?:\w+/)*\w+)\.py[ \t]*(?:\n|\Z)")
_RUN = "__docs_page_run__"  # the key of the PageRun in a Sybil document's namespace


# -- finding the blocks (Sybil) -------------------------------------------------------


class Sample:
    """Sybil evaluator of a visible ```` ```python ```` block."""

    kind = "sample"

    def __call__(self, example: Example) -> None:
        example.namespace[_RUN].run_sample(example)


class Hidden:
    """Sybil evaluator of an ``invisible-code-block: python`` comment."""

    kind = "hidden block"

    def __call__(self, example: Example) -> None:
        example.namespace[_RUN].run_hidden(example)


class Excerpt:
    """Sybil evaluator of a block quoting the repository file ``quotes``."""

    kind = "excerpt"

    def __init__(self, quotes: str) -> None:
        self.quotes = quotes

    def __call__(self, example: Example) -> None:
        quoted = ROOT / self.quotes
        assert quoted.is_file(), f"no file {self.quotes}"
        assert quoted_in(example.parsed, quoted), f"the excerpt is not in {self.quotes} (any more)"


class SampleParser:
    """The Python of a Markdown page: samples, hidden blocks and excerpts."""

    def __init__(self) -> None:
        self.fenced = FencedCodeBlockLexer(language="python")
        self.hidden = DirectiveInHTMLCommentLexer(
            directive="invisible-code-block", arguments="python"
        )

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.fenced(document):
            excerpt = _EXCERPT.search(document.text, 0, region.start)
            region.parsed = region.lexemes["source"]
            region.evaluator = Excerpt(excerpt.group(1)) if excerpt else Sample()
            yield region
        for region in self.hidden(document):
            region.parsed = region.lexemes["source"]
            region.evaluator = Hidden()
            yield region


def parse(page: Path) -> Document:
    """The page, its Python blocks found (in reading order when iterated)."""
    return Document.parse(str(page), SampleParser())


def bound_names(source: str) -> set[str]:
    """The names a block binds at its top level (assignments, imports, defs, ``with ... as``).

    ``x = x`` counts: that is how a hidden block hands a name of the sample
    before it on to the next, when a page tells one story in several samples.
    """
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(child.name)  # its body's names are its own
            elif isinstance(child, ast.Import | ast.ImportFrom):
                names.update((alias.asname or alias.name).split(".")[0] for alias in child.names)
            elif isinstance(child, ast.Lambda | ast.comprehension | ast.GeneratorExp):
                continue
            else:
                if isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                    names.add(child.id)
                visit(child)

    visit(ast.parse(textwrap.dedent(source)))
    return names


def quoted_in(source: str, path: Path) -> bool:
    """Whether ``source`` appears in the file ``path`` line for line, up to indentation."""
    wanted = textwrap.dedent(source).strip("\n").splitlines()
    lines = path.read_text(encoding="utf-8").splitlines()
    return any(
        textwrap.dedent("\n".join(lines[start : start + len(wanted)])).splitlines() == wanted
        for start in range(len(lines) - len(wanted) + 1)
    )


# -- running them ---------------------------------------------------------------------


class PageRun:
    """The namespaces and modules of one page being run (see the module docstring)."""

    def __init__(self, page: Path, fixtures: dict[str, Any], server_address: str) -> None:
        self.page = page
        self.fixtures = fixtures
        self.server_address = server_address
        self.default_name = f"docs_{page.stem.replace('-', '_').lower()}"
        self.current = self._namespace(self.default_name)  # where hidden blocks run
        self.carried: dict[str, Any] = {}  # bound by hidden blocks since the last sample
        self.namespaces = [self.current]
        self.replaced_modules: dict[str, types.ModuleType | None] = {}

    def run_sample(self, example: Example) -> None:
        namespace = self._fresh(example)
        namespace.update(self.carried)
        self.carried = {}
        self._exec(example, namespace)
        self.current = namespace

    def run_hidden(self, example: Example) -> None:
        if _FILE.match(example.parsed):
            self._exec(example, self._fresh(example))  # a hidden file: importable, not carried
            return
        self._exec(example, self.current)
        self.carried.update(
            (name, self.current[name])
            for name in bound_names(example.parsed)
            if name in self.current
        )

    def close(self) -> None:
        """Close the page's Celery apps and lock clients; forget its modules."""
        for namespace in self.namespaces:
            for value in list(namespace.values()):
                if isinstance(value, LockClient | Celery):
                    value.close()
        for name, previous in self.replaced_modules.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous

    def _fresh(self, example: Example) -> dict[str, Any]:
        """A new namespace for ``example``: a module's when the block is a file."""
        file = _FILE.match(example.parsed)
        if file is None:
            namespace = self._namespace(self.default_name)
        else:
            module = self._module(file.group(1).replace("/", "."))
            namespace = module.__dict__
            namespace.update(self.fixtures)
        self.namespaces.append(namespace)
        return namespace

    def _namespace(self, name: str) -> dict[str, Any]:
        return {"__name__": name, **self.fixtures}

    def _module(self, dotted: str) -> types.ModuleType:
        """A new module ``dotted`` in ``sys.modules``, its parent packages made as needed."""
        parts = dotted.split(".")
        parent: types.ModuleType | None = None
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            is_package = depth < len(parts)
            if is_package and name in self.replaced_modules:
                parent = sys.modules[name]  # a package this page already made
                continue
            module = types.ModuleType(name)
            module.__package__ = name if is_package else ".".join(parts[:-1])
            if is_package:
                module.__path__ = []
            self.replaced_modules.setdefault(name, sys.modules.get(name))
            sys.modules[name] = module
            if parent is not None:
                setattr(parent, parts[depth - 1], module)
            parent = module
        assert parent is not None
        return parent

    def _exec(self, example: Example, namespace: dict[str, Any]) -> None:
        source = example.parsed.replace(SAMPLE_ADDRESS, self.server_address)
        # Padded so tracebacks point at the page's own line numbers.
        code = compile(pad(source, example.line + example.parsed.line_offset), example.path, "exec")
        exec(code, namespace)  # running the docs' samples is the point


def run_page(page: Path, fixtures: dict[str, Any], server_address: str) -> None:
    """Run every block of ``page`` in order; AssertionError naming the first that fails."""
    document = parse(page)
    run = PageRun(page, fixtures, server_address)
    document.namespace[_RUN] = run
    try:
        for example in document:
            try:
                example.evaluate()
            except Exception as error:
                kind = getattr(example.region.evaluator, "kind", "block")
                raise AssertionError(
                    f"{page.name}:{example.line}: the {kind} failed: {error!r}\n\n{example.parsed}"
                ) from error
    finally:
        run.close()


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


@contextmanager
def celery_isolated() -> Iterator[None]:
    """Restore Celery's current app and shared tasks after a page; show it only the suite's."""
    default_app, current_app = celery_state.default_app, celery_state.get_current_app()
    shared_tasks = set(celery_state._on_app_finalizers)
    celery_state._on_app_finalizers.clear()
    celery_state._on_app_finalizers.update(_SHARED_TASKS_AT_COLLECTION)
    try:
        yield
    finally:
        celery_state.set_default_app(default_app)
        celery_state._set_current_app(current_app)
        celery_state._on_app_finalizers.clear()
        celery_state._on_app_finalizers.update(shared_tasks)


@pytest.fixture
def fixtures(
    redis_server: RedisServer, r: redis.Redis, settings: SettingsWrapper
) -> Iterator[dict[str, Any]]:
    """The names every block starts with, for a page run against the test server."""
    address = f"redis://127.0.0.1:{redis_server.port}"
    settings.RLOCKS = {"default": {"LOCATION": f"{address}/0"}}
    with celery_isolated():
        yield {
            "REDIS_URL": f"{address}/0",
            "settings": settings,
            "rf": RequestFactory(),
            "held_elsewhere": held_elsewhere,
        }
    locks.close_all()


def _address(fixtures: dict[str, Any]) -> str:
    return str(fixtures["REDIS_URL"]).rsplit("/", 1)[0]


# -- the tests ------------------------------------------------------------------------


@pytest.mark.pure
def test_the_readme_and_the_guides_have_samples() -> None:
    assert len(list(parse(ROOT / "README.md"))) >= 10
    for guide in ("django.md", "celery.md", "migrating.md"):
        assert any(isinstance(e.region.evaluator, Sample) for e in parse(ROOT / "docs" / guide))


#: The comments a page may hold; any other is a hidden block Sybil would not run
#: (a retired or misspelt directive), so it fails instead of passing unseen.
KNOWN_COMMENTS = re.compile(r"<!--\s*(invisible-code-block: python|docs-excerpt \S+)\s")


@pytest.mark.pure
@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_hidden_block_is_one_the_runner_runs(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    unknown = [
        f"line {text.count(chr(10), 0, at) + 1}: {text[at : at + 40]!r}"
        for at in (found.start() for found in re.finditer(r"<!--", text))
        if not KNOWN_COMMENTS.match(text, at)
    ]
    assert not unknown, f"comments the docs test would not run: {unknown}"


# A transactional database: the pages' transaction samples commit and roll back for real.
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_sample_of_the_page_runs(page: Path, fixtures: dict[str, Any]) -> None:
    run_page(page, fixtures, _address(fixtures))


def write_page(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent(text), encoding="utf-8")
    return page


def test_a_sample_does_not_see_an_earlier_samples_names(
    tmp_path: Path, fixtures: dict[str, Any]
) -> None:
    page = write_page(
        tmp_path,
        """
        ```python
        from django_rlock import rlock
        ```

        ```python
        rlock("x")
        ```
        """,
    )
    with pytest.raises(AssertionError, match=r"page.md:6: the sample failed: NameError"):
        run_page(page, fixtures, _address(fixtures))


def test_hidden_setup_reaches_the_next_sample_and_checks_see_the_last(
    tmp_path: Path, fixtures: dict[str, Any]
) -> None:
    page = write_page(
        tmp_path,
        """
        <!-- invisible-code-block: python
        order = 7
        -->

        ```python
        total = order * 2
        ```

        <!-- invisible-code-block: python
        assert total == 14
        -->

        ```python
        assert "total" not in globals()
        ```

        <!-- invisible-code-block: python
        assert total == 15, "a check that fails"
        -->
        """,
    )
    with pytest.raises(AssertionError, match=r"page.md:18: the hidden block failed: NameError"):
        run_page(page, fixtures, _address(fixtures))


def test_a_file_sample_is_importable_until_the_page_ends(
    tmp_path: Path, fixtures: dict[str, Any]
) -> None:
    page = write_page(
        tmp_path,
        """
        <!-- invisible-code-block: python
        # shop_docs/payments.py
        def charge(amount):
            return amount
        -->

        ```python
        # shop_docs/views.py
        from .payments import charge

        paid = charge(3)
        ```

        ```python
        from shop_docs.views import paid

        assert paid == 3 and __name__ == "docs_page"
        ```
        """,
    )
    run_page(page, fixtures, _address(fixtures))
    assert "shop_docs" not in sys.modules and "shop_docs.views" not in sys.modules


def test_an_excerpt_must_match_its_file(tmp_path: Path, fixtures: dict[str, Any]) -> None:
    quoted = ROOT / "example_project" / "orders" / "views.py"
    first_line = quoted.read_text(encoding="utf-8").splitlines()[0]
    excerpt = "<!-- docs-excerpt example_project/orders/views.py -->\n```python\n{}\n```\n"
    run_page(write_page(tmp_path, excerpt.format(first_line)), fixtures, _address(fixtures))
    with pytest.raises(AssertionError, match=r"the excerpt failed: .*not in example_project"):
        run_page(write_page(tmp_path, excerpt.format("x = 1")), fixtures, _address(fixtures))

    code = tmp_path / "code.py"
    code.write_text("def f():\n    if x:\n        return 1\n")
    assert quoted_in("if x:\n    return 1", code)
    assert not quoted_in("if x:\n    return 2", code)
    assert not quoted_in("if x:\nreturn 1", code)  # indentation inside the quote counts
