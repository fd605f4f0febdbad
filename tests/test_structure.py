"""The package's import graph is the layering of docs/engine.md, with no cycles,
and no module reaches into another module's private state.

    celery_rlock -> django_rlock -> django_rlock.core

Each arrow passes through one door: a face takes the engine's internals only
from ``django_rlock.core._faces``, and ``celery_rlock`` takes the Django
face's only from ``django_rlock._celeryface`` (beside the public modules).

The graph is read from the source with :mod:`ast`, so it sees every import:
at module level, inside functions (deferred), and under ``TYPE_CHECKING``
(for types only, never run). Cycles are looked for among all of them: a
deferred import does not make a cycle go away (it only moves the failure from
import time to call time), and a type-only one still ties the two modules
together for a reader.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

import django_rlock

pytestmark = pytest.mark.pure

#: Where the packages under test are: the installed wheel's site-packages under
#: ``make test``, the checkout with an editable install.
ROOT = pathlib.Path(django_rlock.__file__).resolve().parent.parent
PACKAGES = ("django_rlock", "celery_rlock")
LAYERS = ("django", "celery", *PACKAGES)

#: Every deferred (function-level) import of a module of ours, Django or Celery,
#: with the reason it is deferred. A new one must say here why it cannot be
#: at the top of its module.
DEFERRED: dict[tuple[str, str], str] = {
    ("django_rlock._web.decorators", "celery.local"): "Celery is optional for django_rlock",
    ("django_rlock._scopes.taskruns", "celery.signals"): "Celery is optional for django_rlock",
    (
        "django_rlock.apps",
        "django_rlock._scopes.taskruns",
    ): "wired in AppConfig.ready(), where Celery is",
    (
        "django_rlock",
        "django_rlock._scopes.taskruns",
    ): "wired as the package loads, where Celery is",
    ("celery_rlock._conf", "django.conf"): "Django settings are optional for celery_rlock",
    ("django_rlock.apps", "django_rlock._checks"): "registered in AppConfig.ready(), per Django",
    (
        "django_rlock.apps",
        "django_rlock._handler",
    ): "registered in AppConfig.ready(), as Django asks",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, as seen from the importing module."""

    module: str
    target: str
    line: int
    deferred: bool  # inside a function: runs when the function is called
    type_only: bool  # under ``if TYPE_CHECKING:``: never runs


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


@functools.cache
def _tree(path: pathlib.Path) -> ast.Module:
    """``path`` parsed, once for the whole module: several tests walk every module."""
    return ast.parse(path.read_text(), str(path))


def _resolve(target: str) -> str:
    """The module of ours that ``target`` names (``a.b.Name`` -> ``a.b``), or ``target``."""
    candidate = target
    while candidate and candidate not in MODULES:
        candidate = candidate.rpartition(".")[0]
    return candidate or target


def _imports(module: str, path: pathlib.Path) -> Iterator[Import]:
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, deferred: bool, type_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for statement in child.body:
                    yield from visit_statement(statement, deferred, True)
                for statement in child.orelse:
                    yield from visit_statement(statement, deferred, type_only)
            else:
                yield from visit_statement(child, deferred, type_only)

    def visit_statement(node: ast.AST, deferred: bool, type_only: bool) -> Iterator[Import]:
        inside = deferred or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, _resolve(alias.name), node.lineno, deferred, type_only)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                named = f"{base}.{alias.name}"  # a submodule, or a name in ``base``
                target = named if named in MODULES else _resolve(base)
                yield Import(module, target, node.lineno, deferred, type_only)
        yield from visit(node, inside, type_only)

    yield from visit(_tree(path), False, False)


IMPORTS = [found for module, path in MODULES.items() for found in _imports(module, path)]


def _layer_of(target: str) -> str | None:
    top = target.split(".", maxsplit=1)[0]
    if top not in LAYERS:
        return None
    if target == "django_rlock.core" or target.startswith("django_rlock.core."):
        return "django_rlock.core"
    return top


def _where(found: Import) -> str:
    return f"{MODULES[found.module].relative_to(ROOT)}:{found.line} imports {found.target}"


def test_the_graph_is_read() -> None:
    # Guards the reader itself: a few edges known to exist must be found.
    edges = {(found.module, found.target) for found in IMPORTS}
    assert ("celery_rlock._task", "celery_rlock._worker") in edges
    assert ("django_rlock.core._sync.client", "django_rlock.core._sync.watchdog") in edges
    assert ("celery_rlock._decorators", "django_rlock._celeryface") in edges
    assert ("django_rlock._celeryface", "django_rlock._web.decorators") in edges
    assert ("django_rlock.backends._locks", "django_rlock.core._faces") in edges
    assert ("django_rlock.backends._locks", "django_rlock.backends._types") in edges
    # A type-only edge:
    assert ("django_rlock.backends._types", "django_rlock._observers.holdtimes") in edges
    assert len(MODULES) > 40


def test_the_core_imports_neither_django_nor_celery_nor_the_layers_above() -> None:
    wrong = [
        _where(found)
        for found in IMPORTS
        if _layer_of(found.module) == "django_rlock.core"
        and _layer_of(found.target) not in (None, "django_rlock.core")
    ]
    assert wrong == []


def test_django_rlock_imports_celery_only_where_documented() -> None:
    wrong = [
        _where(found)
        for found in IMPORTS
        if _layer_of(found.module) == "django_rlock"
        and _layer_of(found.target) == "celery"
        and not found.type_only
        and not (found.deferred and (found.module, found.target) in DEFERRED)
    ]
    assert wrong == []


def test_the_django_face_never_imports_the_celery_face() -> None:
    # Not even for types or at call time: celery_rlock registers its task
    # runner with the Django face (register_task_runner), as Django apps
    # register signal receivers.
    wrong = [
        _where(found)
        for found in IMPORTS
        if _layer_of(found.module) in ("django_rlock", "django_rlock.core")
        and _layer_of(found.target) == "celery_rlock"
    ]
    assert wrong == []


#: The engine's modules a face may import: its public ones, and its one door for
#: the faces (grouped re-exports of the internals they borrow).
ENGINE_PUBLIC = (
    "django_rlock.core",
    "django_rlock.core.aio",
    "django_rlock.core.exceptions",
    "django_rlock.core.defaults",
)
ENGINE_DOOR = "django_rlock.core._faces"
#: The Django face's one door for the Celery face.
DJANGO_DOOR = "django_rlock._celeryface"


def _internal(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def test_the_faces_reach_the_engine_only_through_its_public_modules_and_one_door() -> None:
    # Every import counts, type-only and deferred too: a move inside the engine
    # then changes _faces.py's import lines, never a face module.
    faces = [module for module in MODULES if _layer_of(module) != "django_rlock.core"]
    assert len(faces) > 30
    wrong = [
        _where(found)
        for found in IMPORTS
        if found.module in faces
        and _layer_of(found.target) == "django_rlock.core"
        and found.target not in (*ENGINE_PUBLIC, ENGINE_DOOR)
    ]
    assert wrong == [], f"import it from a public module of the engine, or from {ENGINE_DOOR}"


def test_celery_rlock_reaches_the_django_face_only_through_its_public_modules_and_one_door() -> (
    None
):
    wrong = [
        _where(found)
        for found in IMPORTS
        if _layer_of(found.module) == "celery_rlock"
        and _layer_of(found.target) == "django_rlock"
        and _internal(found.target)
        and found.target != DJANGO_DOOR
    ]
    assert wrong == [], f"import it from a public module of django_rlock, or from {DJANGO_DOOR}"


@functools.cache
def _import_froms(path: pathlib.Path) -> list[ast.ImportFrom]:
    """Every ``from ... import`` of a module, at any depth (walked once per module)."""
    return [node for node in ast.walk(_tree(path)) if isinstance(node, ast.ImportFrom)]


def _borrowed(door: str) -> set[str]:
    """The names the other modules import from ``door``."""
    names: set[str] = set()
    for module, path in MODULES.items():
        for node in _import_froms(path):
            if node.module == door and module != door:
                names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("door", [ENGINE_DOOR, DJANGO_DOOR])
def test_a_door_is_a_list_of_imports_each_used(door: str) -> None:
    # Re-exports only, so the door holds no logic of its own and a move inside
    # a layer is an import line here; and none stale.
    tree = _tree(MODULES[door])
    statements = tree.body[1:] if ast.get_docstring(tree) else tree.body
    assert [ast.unparse(node) for node in statements if not isinstance(node, ast.ImportFrom)] == []
    imports = [node for node in statements if isinstance(node, ast.ImportFrom)]
    offered = {alias.name for node in imports for alias in node.names}
    assert len(offered) > 5
    assert sorted(offered - _borrowed(door)) == [], "no module of ours uses these: drop them"
    layer = "django_rlock.core" if door == ENGINE_DOOR else "django_rlock"
    foreign = [
        _where(found)
        for found in IMPORTS
        if found.module == door and _layer_of(found.target) != layer
    ]
    assert foreign == [], "a door re-exports its own layer's names only"


def test_every_deferred_import_is_listed_with_its_reason() -> None:
    deferred = {
        (found.module, found.target): _where(found)
        for found in IMPORTS
        if found.deferred and not found.type_only and _layer_of(found.target) is not None
    }
    unlisted = [where for key, where in deferred.items() if key not in DEFERRED]
    assert unlisted == [], "say in DEFERRED why each cannot be at the top of its module"
    assert sorted(set(DEFERRED) - set(deferred)) == [], "DEFERRED lists imports that are gone"


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (its first node repeated at the end), or None."""
    on_path, done = 1, 2
    state: dict[str, int] = {}
    for start in sorted(graph):
        if start in state:
            continue
        path, state[start] = [start], on_path
        stack = [iter(sorted(graph[start]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:
                stack.pop()
                state[path.pop()] = done
            elif state.get(following) == on_path:
                return [*path[path.index(following) :], following]
            elif following not in state:
                state[following] = on_path
                path.append(following)
                stack.append(iter(sorted(graph.get(following, ()))))
    return None


def test_find_cycle_reports_the_path() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycles() -> None:
    # Every import counts: at module level, deferred into a function (it only
    # moves the failure to call time) and under TYPE_CHECKING (a reader still
    # has to know both modules to read either).
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for found in IMPORTS:
        if found.target in MODULES and found.target != found.module:
            graph[found.module].add(found.target)
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


#: What the protocol package (django_rlock/core/_protocol) may not import: it
#: builds calls and reads replies, and the engines do the I/O.
IO_MODULES = ("socket", "select", "selectors", "ssl", "asyncio", "subprocess")
PROTOCOL = "django_rlock.core._protocol"
ENGINES = ("django_rlock.core._sync", "django_rlock.core._aio")


def test_the_protocol_package_does_no_io() -> None:
    protocol = [module for module in MODULES if module.startswith(PROTOCOL)]
    assert len(protocol) > 10
    wrong = [
        _where(found)
        for found in IMPORTS
        if found.module in protocol
        and (
            found.target.split(".")[0] in IO_MODULES
            or found.target.startswith(ENGINES)
            or (
                found.target.split(".")[0] == "redis"
                and not found.target.startswith(("redis.exceptions", "redis.crc"))
            )
        )
    ]
    assert wrong == []
    # Nor does it start a thread or an event loop itself.
    started = [
        f"{MODULES[module].relative_to(ROOT)}: {call}"
        for module in protocol
        for call in ("Thread(", "new_event_loop(", "asyncio.run(", "create_task(")
        if call in MODULES[module].read_text()
    ]
    assert started == []


#: Private attributes of other code that a module of ours reads, with the reason:
#: each belongs to a third-party library that offers no public way to do it.
FOREIGN_PRIVATES: dict[tuple[str, str], str] = {
    ("django_rlock.core._sync.waiting", "_sock"): (
        "redis-py 5 has no public is_connected or socket accessor; the listener writes"
        " SUBSCRIBE to the socket itself so that no write can reconnect (see _send_locked)"
    ),
    ("django_rlock.cache", "_servers"): (
        "Django's RedisCache keeps its LOCATION list there, with no public accessor"
    ),
    ("django_rlock.cache", "_cache"): "Django's RedisCache client, to share its connection pool",
    ("django_rlock.cache", "_get_connection_pool"): (
        "Django's RedisCache client offers no public way to its (thread-safe) pool"
    ),
    ("django_rlock.management.commands.rlock", "_actions"): (
        "argparse lists no parser's actions publicly; Django's call_command reads them too"
    ),
    ("django_rlock.core._process.holder", "_get_running_loop"): (
        "asyncio.current_task() raises outside an event loop; _get_running_loop() (what"
        " get_running_loop() calls) says None at a tenth of the cost, on every acquire"
    ),
    ("django_rlock._scopes.transactions", "_get_running_loop"): (
        "the end of every with block reads the thread's DB connections: outside an event"
        " loop, asgiref's _ThreadCriticalLocal reads its _storage (a threading.local),"
        " which is read directly, without the two exceptions of a read through the Local"
    ),
    ("django_rlock._callsite", "_getframe"): (
        "sys._getframe walks the caller's frames without inspect.stack()'s cost"
    ),
    ("django_rlock.core._process.lockorder", "_getframe"): (
        "the lock order check's call sites, as django_rlock._callsite's"
        " (the engine cannot import the face)"
    ),
    ("celery_rlock._decorators", "_get_app"): (
        "a Celery task's app, bound or not; Celery offers only the private accessor"
    ),
    ("django_rlock.core._aio.wire", "_writer"): (
        "redis-py's asyncio connection has no accessor of the streams it connected (TLS,"
        " AUTH, HELLO, SELECT done): the lean path takes their socket over, and says when"
        " it is closed (its _reader too, a name the wire's protocol also uses)"
    ),
    ("django_rlock.core._aio.wire", "_buffer"): (
        "asyncio's StreamReader shows no unread bytes publicly: none may be left past the"
        " handshake when its socket is taken over"
    ),
    ("django_rlock.core._sync.locks", "_detector"): (
        "the waiting shell asks its own lock, an RLock, whose base DeadlockWaiter"
        " (_protocol/deadlocks.py) holds it for both engines"
    ),
    ("django_rlock.core._aio.locks", "_detector"): (
        "the waiting shell asks its own lock, an AsyncRLock, as the threaded shell does"
    ),
}


def _own_names(tree: ast.Module) -> set[str]:
    """The names a module defines: its functions, classes, variables and ``self.`` attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            names.add(node.attr)
    return names


def _foreign_privates(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()``, nor ``_name`` its own.

    A module may use the private names it defines itself on any object (its
    own classes' instances, its module-level helpers): the test cannot see
    types, so a private name defined here and in another module is let
    through. Everything else with a leading underscore belongs to someone else.
    """
    own = _own_names(tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr, value = node.attr, node.value
        if not attr.startswith("_") or attr.startswith("__") or attr in own:
            continue
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            continue
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "super":
            continue
        yield attr, node.lineno


def test_foreign_privates_are_found() -> None:
    source = "class A:\n    def f(self, other):\n        self._a = other._b + self._c\n"
    assert list(_foreign_privates(ast.parse(source))) == [("_b", 3)]


def test_no_module_reads_another_modules_private_state() -> None:
    found = [
        (module, attr, f"{path.relative_to(ROOT)}:{line}")
        for module, path in MODULES.items()
        for attr, line in _foreign_privates(_tree(path))
    ]
    unlisted = [
        f"{where}: .{attr}"
        for module, attr, where in found
        if (module, attr) not in FOREIGN_PRIVATES
    ]
    assert unlisted == [], "use or add a public method of the other module instead"
    used = {(module, attr) for module, attr, _ in found}
    assert sorted(set(FOREIGN_PRIVATES) - used) == [], "stale allow-list entries"


# -- the engine's floors: _process, then _protocol, then _sync and _aio side by side --------

CORE = "django_rlock.core"
PROCESS = "django_rlock.core._process"
SYNC = "django_rlock.core._sync"
AIO = "django_rlock.core._aio"

#: The one thing the asyncio engine takes from the threaded one, with the reason.
#: Everything else both engines need without I/O is in ``_protocol`` (or below).
AIO_FROM_SYNC: dict[tuple[str, str], str] = {
    (f"{AIO}.client", f"{SYNC}.client"): (
        "the renewal engine: an AsyncLockClient keeps its holds in a threaded LockClient's"
        " hold registry and watchdog (sync and asyncio owners of a process share one)"
    ),
}

#: The longest a module of ours may be, in lines: past it, split it by concept.
MAX_MODULE_LINES = 800


def _inside(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def test_the_process_floor_imports_nothing_above_it() -> None:
    # Not even for types: _process is read first, and alone (identity, forks,
    # scopes, leaks); the floors above hand it what it reads (_process/kept.py).
    wrong = [
        _where(found)
        for found in IMPORTS
        if _inside(found.module, PROCESS)
        and _inside(found.target, CORE)
        and not _inside(found.target, PROCESS)
        and found.target not in (f"{CORE}.exceptions", f"{CORE}.defaults")
    ]
    assert wrong == []


def test_the_asyncio_engine_stands_beside_the_threaded_one() -> None:
    # _aio and _sync are twins with the same file names; neither imports the
    # other, but for the renewal engine (AIO_FROM_SYNC), named here.
    found_pairs = {
        (found.module, found.target): _where(found)
        for found in IMPORTS
        if _inside(found.module, AIO) and _inside(found.target, SYNC)
    }
    unlisted = [where for pair, where in found_pairs.items() if pair not in AIO_FROM_SYNC]
    assert unlisted == [], "move what both engines share to _protocol"
    assert sorted(set(AIO_FROM_SYNC) - set(found_pairs)) == [], "AIO_FROM_SYNC lists gone imports"
    backwards = [
        _where(found)
        for found in IMPORTS
        if _inside(found.module, SYNC) and _inside(found.target, AIO)
    ]
    assert backwards == []


def test_the_twins_have_the_same_file_names() -> None:
    # Each kind's shells: one module per kind in each engine, named as its
    # protocol in _protocol (locks.py is the plain lock's, whose protocol is lock.py).
    def names(package: str) -> set[str]:
        return {module.rpartition(".")[2] for module in MODULES if module.startswith(package + ".")}

    kinds = {"locks", "fairlock", "rwlock", "semaphore", "redisson", "leader", "ratelimiter"}
    assert kinds <= names(SYNC)
    assert kinds <= names(AIO)
    protocol_kinds = {"lock", "fairlock", "rwlock", "semaphore", "redisson", "leader", "ratelimit"}
    assert protocol_kinds <= names(PROTOCOL)


#: The Django face's ground floor: what its locks and their observers share.
DJANGO_GROUND = (
    "django_rlock.exceptions",
    "django_rlock.signals",
    "django_rlock._conf",
    "django_rlock._keys",
    "django_rlock._callsite",
    "django_rlock.backends._types",
)
#: The Django face's first rooms above its ground floor: each imports the engine,
#: the ground floor and itself only (so no two rooms import each other), and
#: never the alias locks or the backends: those import them.
DJANGO_ROOMS = ("django_rlock._observers", "django_rlock._scopes")
#: Beside the ground floor, what a room may import, and why.
ROOMS_ALSO = {
    # Retry-After unwraps a thread-run lock; the wrapper imports only the engine.
    (
        "django_rlock._observers",
        "django_rlock.backends._threadowned",
    ): "unwraps a thread-owned lock",
}


def test_the_django_ground_floor_imports_no_other_room() -> None:
    # Type-only imports aside (the hold times' type in AliasBackend).
    wrong = [
        _where(found)
        for found in IMPORTS
        if found.module in DJANGO_GROUND
        and _layer_of(found.target) == "django_rlock"
        and not _inside(found.target, "django_rlock.core")
        and found.target not in DJANGO_GROUND
        and not found.type_only
    ]
    assert wrong == []


@pytest.mark.parametrize("room", DJANGO_ROOMS)
def test_a_django_room_imports_only_the_ground_floor_and_itself(room: str) -> None:
    # The observers tell an alias's lock by AliasAttached (backends/_types.py),
    # so the locks may import them and never the other way around.
    members = [module for module in MODULES if _inside(module, room)]
    assert len(members) >= 3
    wrong = [
        _where(found)
        for found in IMPORTS
        if found.module in members
        and _layer_of(found.target) == "django_rlock"
        and not _inside(found.target, room)
        and not _inside(found.target, "django_rlock.core")
        and found.target not in DJANGO_GROUND
        and (room, found.target) not in ROOMS_ALSO
    ]
    assert wrong == []


def test_nothing_beneath_the_web_room_imports_it() -> None:
    # The entry points (decorators, shortcuts, leader, ratelimited, responses)
    # stand on the backends, the lock handler and the rooms; only the package,
    # the middleware, the checks and the Celery door import them.
    beneath = [
        module
        for module in MODULES
        if module in (*DJANGO_GROUND, "django_rlock._handler")
        or any(_inside(module, room) for room in (*DJANGO_ROOMS, "django_rlock.backends"))
    ]
    assert len(beneath) > 20
    wrong = [
        _where(found)
        for found in IMPORTS
        if found.module in beneath and _inside(found.target, "django_rlock._web")
    ]
    assert wrong == []


def test_no_module_is_over_the_line_cap() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for path in MODULES.values()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    ]
    assert long == [], f"split each by concept (at most {MAX_MODULE_LINES} lines a module)"


def _code_map() -> dict[str, set[str]]:
    """docs/engine.md's code map: folder of django_rlock/core ('' for its top) -> files named."""
    doc = pathlib.Path(__file__).resolve().parent.parent / "docs" / "engine.md"
    text = doc.read_text()
    block = text[text.index("```\ndjango_rlock/core/\n") :]
    block = block[: block.index("\n```", 4)]
    named: dict[str, set[str]] = {"": set()}
    folder = ""
    for line in block.splitlines()[2:]:
        indent = len(line) - len(line.lstrip())
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        if indent == 2 and first.endswith("/"):
            folder = first.rstrip("/")
            named[folder] = set()
            continue
        if indent == 2:
            folder = ""
        if indent <= 4:  # a description's continuation is indented further
            names = re.match(r"\s*((?:\w+\.py,? )+)", line + " ")
            named[folder] |= set(re.findall(r"\w+\.py", names.group(1) if names else ""))
    return named


def test_the_engine_code_map_names_every_module() -> None:
    named = _code_map()
    core = ROOT / "django_rlock" / "core"
    missing = [
        str(path.relative_to(core))
        for path in sorted(core.rglob("*.py"))
        if not (path.name == "__init__.py" and path.parent != core)
        and path.name not in named.get(path.parent.name if path.parent != core else "", set())
    ]
    assert missing == [], "docs/engine.md's code map (Where the code is) must name them"


# -- the map inside the repository -------------------------------------------------------

#: The one file that may name the team's folder beside the clone: the interop
#: tests' locator of Redisson's emulator (REDISSON_EMULATOR_DIR overrides it).
SHARED_LOCATOR = "tests/interop/conftest.py"

#: The team's folder as a relative path, spelt in pieces so that this file,
#: which looks for it, does not cite it.
TEAM_FOLDER = "/".join(("..", "shared"))

#: What a clone's own tooling leaves beside the sources (not the repository's text).
UNTRACKED_DIRS = {"build", "site", "node_modules", "__pycache__"}


def repository_files(tree: pathlib.Path) -> Iterator[pathlib.Path]:
    """The repository's text files under ``tree``: no hidden, build or virtualenv folder.

    Those folders are pruned, not walked and filtered: a checkout's virtualenvs
    and nox's hold some 100,000 files (the walk took 6 s, 20 s on a loaded machine).
    """
    for folder, dirs, files in os.walk(tree):
        dirs[:] = [
            name
            for name in dirs
            if not (name.startswith(".") or name in UNTRACKED_DIRS or name.endswith(".egg-info"))
        ]
        for name in files:
            path = pathlib.Path(folder, name)
            text = path.suffix in {".py", ".md", ".cfg", ".toml", ".yml", ".txt", ".lua"}
            if (text or name == "Makefile") and path.is_file():
                yield path


def test_no_file_but_the_emulator_locator_cites_the_team_folder() -> None:
    """A user's clone has no team folder: the repository keeps its own map (docs/engine.md)."""
    tree = pathlib.Path(os.environ.get("RLOCK_SOURCE_TREE") or ROOT)
    citing = sorted(
        path.relative_to(tree).as_posix()
        for path in repository_files(tree)
        if TEAM_FOLDER in path.read_text(encoding="utf-8", errors="replace")
    )
    assert citing == [SHARED_LOCATOR]


def test_every_module_with_a_pure_test_is_in_the_fast_suite_list() -> None:
    """``make test-fast`` runs the paths tests/pure.txt names; a module left out is never run there.

    The full suite refuses it at collection (tests/conftest.py), but under xdist
    that refusal only shows as a worker that stopped; read from the text here,
    in the fast suite itself, it is named at once.
    """
    tree = pathlib.Path(os.environ.get("RLOCK_SOURCE_TREE") or ROOT)
    tests = tree / "tests"
    listed = [tree / line for line in (tests / "pure.txt").read_text(encoding="utf-8").split()]
    unlisted = sorted(
        path.relative_to(tree).as_posix()
        for path in tests.rglob("test_*.py")
        if "mark.pure" in path.read_text(encoding="utf-8")
        and not any(path == entry or entry in path.parents for entry in listed)
    )
    assert unlisted == []
