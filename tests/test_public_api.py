"""What users import: every package's ``__all__`` is exact, and every error is reachable.

``from X import *`` must give exactly ``X.__all__`` and every name must
resolve (``django_rlock`` loads its names lazily, so a stale entry would only
fail when used). Every exception a caller may catch is importable from
``django_rlock`` and ``django_rlock.exceptions``.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib
import re
import typing

import pytest

import django_rlock
from django_rlock import exceptions
from django_rlock.core import exceptions as core_exceptions

pytestmark = pytest.mark.pure

#: Where the packages under test are: the installed wheel's site-packages under
#: ``make test``, the checkout with an editable install.
ROOT = pathlib.Path(django_rlock.__file__).resolve().parent.parent

#: The documented public surface: each module the API reference renders
#: (docs/api/*.md) and exactly the names it exports. Every other module is
#: internal: underscored (or inside an underscored package), with no ``__all__``.
DOCUMENTED: dict[str, list[str]] = {
    "django_rlock": [
        "DeadlockError", "InvalidLockBackendError", "InvalidLockNameError", "LockError",
        "LockLostError", "LockNotOwnedError", "LockNotReplicatedError", "LockOrderWarning",
        "LockOutOfMemoryError", "LockSettingError", "LockTimeout", "LockUnavailableError",
        "LockUpgradeError", "MissingAppWarning", "RateLimitExceeded", "UnformattedNameWarning",
        "leader", "locked", "locks", "rate_limited", "rlock", "semaphore",
    ],
    "django_rlock.exceptions": [
        "DeadlockError", "InvalidLockBackendError", "InvalidLockNameError", "LockError",
        "LockLostError", "LockNotOwnedError", "LockNotReplicatedError", "LockOrderWarning",
        "LockOutOfMemoryError", "LockSettingError", "LockTimeout", "LockUnavailableError",
        "LockUpgradeError", "RateLimitExceeded",
    ],
    "django_rlock.signals": [
        "lock_acquired", "lock_deadlock", "lock_leaked", "lock_lost", "lock_released",
    ],
    "django_rlock.middleware": ["LockErrorMiddleware", "invalid_name_response"],
    "django_rlock.testing": [
        "GuardedTestRunner", "IsolatedRLocksMixin", "NotIsolatedError", "guard_rlocks",
        "held_elsewhere", "isolated_rlocks", "override_rlocks", "rlocks", "rlocks_server",
        "shared_server",
    ],
    "django_rlock.cache": ["RedisCache", "check_lock_cache", "lock_client_for"],
    "django_rlock.backends.base": [
        "AsyncLimiter", "AsyncLock", "AsyncReadWriteLock", "BaseLockBackend",
        "InvalidLockBackendError", "LimiterState", "LockInfo", "display_owner",
    ],
    "django_rlock.backends.redis": ["RedisLockBackend"],
    "django_rlock.backends.embedded": [
        "EmbeddedRedisLockBackend", "EmbeddedServerError", "default_location",
    ],
    "django_rlock.backends.locmem": ["LocMemLockBackend"],
    "django_rlock.core": [
        "DeadlockError", "FairLock", "InvalidLockNameError", "Leadership", "LockClient",
        "LockError", "LockLostError", "LockNotOwnedError", "LockNotReplicatedError",
        "LockOrderWarning", "LockOutOfMemoryError", "LockTimeout", "LockUnavailableError",
        "LockUpgradeError", "MultiLock", "RLock", "RateLimitExceeded", "RateLimiter", "ReadLock",
        "ReadWriteLock", "RedLock", "Semaphore", "Term", "WriteLock",
    ],
    "django_rlock.core.aio": [
        "AsyncFairLock", "AsyncLeadership", "AsyncLockClient", "AsyncRLock", "AsyncRateLimiter",
        "AsyncReadLock", "AsyncReadWriteLock", "AsyncSemaphore", "AsyncWriteLock",
    ],
    "django_rlock.core.exceptions": [
        "DeadlockError", "InvalidLockNameError", "LockError", "LockLostError", "LockNotOwnedError",
        "LockNotReplicatedError", "LockOrderWarning", "LockOutOfMemoryError", "LockTimeout",
        "LockUnavailableError", "LockUpgradeError", "RateLimitExceeded",
    ],
    "django_rlock.core.defaults": [
        "DEFAULT_DEADLOCK_TIMEOUT", "DEFAULT_KEY_PREFIX", "DEFAULT_LOCK_ALIAS",
        "DEFAULT_REPLICA_SYNC_TIMEOUT",
        "DEFAULT_WATCHDOG_TIMEOUT", "MIN_WATCHDOG_TIMEOUT", "renewal_interval",
        "renewal_socket_timeout",
    ],
    "celery_rlock": [
        "AlreadyQueued", "ConfigurationError", "LockedTask", "SkippedResult", "TaskLock",
        "locked",
    ],
    "celery_rlock.beat": [
        "CLAIM_SLOT", "SLOT_HEADER", "TOKEN_HEADER", "ElectedScheduler", "scheduled_at",
    ],
    "celery_rlock.signals": ["duplicate_dropped"],
}  # fmt: skip

#: Modules that are neither documented nor underscored, because Django finds
#: them by name (the app's config, admin, models, migrations and commands).
DJANGO_CONVENTIONS = ("apps", "admin", "models", "migrations", "management")

#: The modules users import names from (the README, the API reference).
PUBLIC = tuple(DOCUMENTED)


def _every_module() -> list[str]:
    names = []
    for package in ("django_rlock", "celery_rlock"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join(parts))
    return names


def _internal(name: str) -> bool:
    return any(part.startswith("_") for part in name.split("."))


@pytest.mark.parametrize("name", PUBLIC)
def test_a_documented_module_exports_exactly_its_documented_names(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(DOCUMENTED[name])


def test_only_documented_modules_have_all_and_every_other_module_is_internal() -> None:
    with_all, neither = [], []
    for name in _every_module():
        module = importlib.import_module(name)
        if hasattr(module, "__all__"):
            with_all.append(name)
        if name not in DOCUMENTED and not _internal(name):
            top = name.split(".")[1] if "." in name else name
            if top not in DJANGO_CONVENTIONS and name != "django_rlock.backends":
                neither.append(name)
    assert sorted(with_all) == sorted(DOCUMENTED)
    assert neither == [], "underscore the module, or document it (docs/api) and pin it here"


#: Classes the API reference renders though no public module exports them, with why.
RENDERED_CLASSES = {
    "django_rlock.backends._locks.AliasLock": "what rlock() and locks[alias].lock() return",
}


def _directives() -> list[tuple[str, list[str] | None]]:
    """Each ``::: path`` of docs/api/*.md and its ``members:`` option (None: ``__all__``)."""
    # The docs travel with the tests (noxfile.py stages docs/ beside tests/).
    pages = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api"
    found: list[tuple[str, list[str] | None]] = []
    for page in sorted(pages.glob("*.md")):
        text = page.read_text()
        for block in re.split(r"(?m)^(?=::: )", text)[1:]:
            path = block.splitlines()[0].removeprefix(":::").strip()
            members = re.search(r"(?m)^ +members: \[(?P<names>[^\]]*)\]", block)
            names = None if members is None else re.findall(r"\w+", members["names"])
            found.append((path, names))
    return found


def test_the_api_reference_renders_exactly_the_documented_modules() -> None:
    rendered = [path for path, _ in _directives()]
    assert sorted(rendered) == sorted([*DOCUMENTED, *RENDERED_CLASSES])


def test_the_api_reference_renders_each_exported_object_once() -> None:
    # Each object (by identity) once on the site: an exception re-exported by four
    # modules is documented where it is defined, and linked from the others.
    shown: dict[int, list[str]] = {}
    for path, members in _directives():
        if path in RENDERED_CLASSES:
            module_name, _, name = path.rpartition(".")
            shown.setdefault(id(getattr(importlib.import_module(module_name), name)), []).append(
                path
            )
            continue
        module = importlib.import_module(path)
        assert members is None or set(members) <= set(module.__all__), path
        for name in module.__all__ if members is None else members:
            value = getattr(module, name)
            if isinstance(value, int | float | str):
                continue  # equal constants may share one object (two DEFAULT_* of 1.0)
            shown.setdefault(id(value), []).append(f"{path}.{name}")
    twice = sorted(paths for paths in shown.values() if len(paths) > 1)
    assert twice == []
    values = {
        f"{module}.{name}": getattr(importlib.import_module(module), name)
        for module, names in DOCUMENTED.items()
        for name in names
    }
    constant = int | float | str  # equal constants may share one object: not counted
    exported = {
        id(value): path for path, value in values.items() if not isinstance(value, constant)
    }
    missing = sorted(path for key, path in exported.items() if key not in shown)
    assert missing == [], "render it once in docs/api/*.md"


@pytest.mark.parametrize("name", PUBLIC)
def test_star_import_gives_exactly_all(name: str) -> None:
    module = importlib.import_module(name)
    namespace: dict[str, object] = {}
    exec(f"from {name} import *", namespace)
    namespace.pop("__builtins__")
    assert sorted(namespace) == sorted(module.__all__)
    assert all(value is not None for value in namespace.values())


@pytest.mark.parametrize("name", _every_module())
def test_every_name_in_all_resolves(name: str) -> None:
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", [])
    assert len(set(exported)) == len(exported), "__all__ lists a name twice"
    assert [item for item in exported if not hasattr(module, item)] == []


#: Errors deliberately not exported at the top, with the reason.
NOT_EXPORTED = {
    # The embedded backend's start-up failure: a settings/deployment problem of
    # that backend, reported from the module that starts the server.
    "EmbeddedServerError": "django_rlock.backends._embedded_server",
    # A test's failure (an AssertionError) under the opt-in guard, raised in tests only.
    "NotIsolatedError": "django_rlock.testing",
}


def _defined_errors(module: object) -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(module).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == getattr(module, "__name__", None)
    }


def test_every_error_is_importable_from_django_rlock_and_its_exceptions() -> None:
    errors = {**_defined_errors(core_exceptions), **_defined_errors(exceptions)}
    assert "LockNotReplicatedError" in errors
    assert sorted(errors) == sorted(exceptions.__all__)
    for name, error in errors.items():
        assert name in django_rlock.__all__
        assert getattr(django_rlock, name) is error


def test_every_error_raised_anywhere_is_caught_by_an_exported_one() -> None:
    import celery_rlock  # noqa: PLC0415 -- only this test needs Celery

    exported = [
        getattr(package, name)
        for package in (django_rlock, celery_rlock)
        for name in package.__all__
        if inspect.isclass(getattr(package, name))
    ]
    uncatchable = []
    for name in _every_module():
        module = importlib.import_module(name)
        for error_name, error in _defined_errors(module).items():
            if NOT_EXPORTED.get(error_name) == name:
                continue
            if not any(issubclass(error, base) for base in exported):
                uncatchable.append(f"{name}.{error_name}")
    assert uncatchable == []
    assert "ConfigurationError" in celery_rlock.__all__
    assert "AlreadyQueued" in celery_rlock.__all__


#: Client methods whose return type is internal: the engine's door for the Django and
#: Celery faces (tests/test_structure.py), not a user's call.
FRIEND_METHODS = frozenset({"LockClient.watched_holds", "AsyncLockClient.send"})


def _returned_classes(owner: type) -> dict[str, type]:
    """The classes of this project that ``owner``'s public methods are annotated to return."""
    returned: dict[str, type] = {}
    for name, method in inspect.getmembers(owner, inspect.isfunction):
        if name.startswith("_"):
            continue
        hint = typing.get_type_hints(method).get("return")
        for candidate in (hint, *typing.get_args(hint)):
            if inspect.isclass(candidate) and candidate.__module__.startswith("django_rlock"):
                returned[f"{owner.__name__}.{name}"] = candidate
    return returned


@pytest.mark.parametrize("client", ["LockClient", "AsyncLockClient"])
def test_every_class_a_client_returns_is_importable_from_a_documented_module(client: str) -> None:
    from django_rlock.core import LockClient  # noqa: PLC0415 -- parametrized by name
    from django_rlock.core.aio import AsyncLockClient  # noqa: PLC0415

    owner = {"LockClient": LockClient, "AsyncLockClient": AsyncLockClient}[client]
    exported = {
        id(getattr(importlib.import_module(module), name))
        for module, names in DOCUMENTED.items()
        for name in names
    }
    hidden = {
        method: f"{cls.__module__}.{cls.__qualname__}"
        for method, cls in _returned_classes(owner).items()
        if id(cls) not in exported and method not in FRIEND_METHODS
    }
    assert hidden == {}


def _documented_classes() -> list[type]:
    return [
        value
        for module, names in DOCUMENTED.items()
        for name in names
        if inspect.isclass(value := getattr(importlib.import_module(module), name))
    ]


def test_every_class_the_django_face_hands_out_is_or_extends_a_documented_one() -> None:
    # What locks[alias].<method>() and rlock()/semaphore()/leader() return may be an
    # internal subclass (AliasLock), but a user annotates it with a documented
    # class (RLock), and a custom backend imports what its methods return.
    from django_rlock.backends.base import BaseLockBackend  # noqa: PLC0415 -- needs Django

    documented = _documented_classes()
    returned = _returned_classes(BaseLockBackend)
    for name in ("rlock", "semaphore", "leader"):
        hint = typing.get_type_hints(getattr(django_rlock, name)).get("return")
        returned.update({name: hint} if inspect.isclass(hint) else {})
    assert {"BaseLockBackend.read_write_lock", "leader", "BaseLockBackend.rate_limiter"} <= set(
        returned
    )
    undocumented = {
        method: f"{cls.__module__}.{cls.__qualname__}"
        for method, cls in returned.items()
        if not any(base in cls.__mro__ for base in documented)
    }
    assert undocumented == {}
