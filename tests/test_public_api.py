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

import pytest

import django_rlock
from django_rlock import exceptions
from django_rlock.core import exceptions as core_exceptions

pytestmark = pytest.mark.pure

#: Where the packages under test are: the installed wheel's site-packages under
#: ``make test``, the checkout with an editable install.
ROOT = pathlib.Path(django_rlock.__file__).resolve().parent.parent

#: The modules users import names from (shared/DESIGN.md, README).
PUBLIC = (
    "django_rlock",
    "django_rlock.core",
    "django_rlock.core.aio",
    "django_rlock.exceptions",
    "django_rlock.middleware",
    "django_rlock.testing",
    "celery_rlock",
)


def _every_module() -> list[str]:
    names = []
    for package in ("django_rlock", "celery_rlock"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if not parts[-1].startswith("_") or len(parts) == 1:
                names.append(".".join(parts))
    return names


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
