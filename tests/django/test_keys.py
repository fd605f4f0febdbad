"""Lock names built from a call (``@locked``, Celery's task keys): long ones never
collide with a name a caller can build, and a bad one is an InvalidLockNameError."""

from __future__ import annotations

import hashlib
import threading

import pytest
import redis

from django_rlock import InvalidLockNameError, locked
from django_rlock._keys import build_key
from django_rlock.core._protocol.names import MAX_NAME_BYTES

HANG = 10.0


def _page(slug: str) -> None:
    """A function whose lock name is ``page:{slug}``."""


def test_a_crafted_slug_never_locks_a_long_slugs_key(r: redis.Redis) -> None:
    long_slug = "a" * 2000
    long_name = f"page:{long_slug}"
    # The form long names were hashed to: a 268-character name any slug could spell.
    crafted_name = f"{long_name[:200]}...#{hashlib.sha256(long_name.encode()).hexdigest()}"
    crafted_slug = crafted_name.removeprefix("page:")
    assert len(crafted_name) == 268

    inside = threading.Event()
    leave = threading.Event()

    @locked("page:{slug}", timeout=0)
    def edit(slug: str) -> str:
        if slug == long_slug:
            inside.set()
            leave.wait(HANG)
        return slug

    holder = threading.Thread(target=edit, args=(long_slug,))
    holder.start()
    try:
        assert inside.wait(HANG)
        # Another owner, while the long slug's lock is held: a different lock.
        assert edit(crafted_slug) == crafted_slug
    finally:
        leave.set()
        holder.join(HANG)
    assert build_key("page:{slug}", _page, (long_slug,), {}) != crafted_name
    assert len(build_key("page:{slug}", _page, (long_slug,), {}).encode()) <= MAX_NAME_BYTES


@pytest.mark.parametrize("slug", ["a\nb", "a\x00b", "a" * 2000 + "\r"])
def test_a_slug_with_a_control_character_is_an_invalid_name(slug: str) -> None:
    with pytest.raises(InvalidLockNameError, match="control characters"):
        build_key("page:{slug}", _page, (slug,), {})


def test_a_template_that_cannot_format_stays_a_plain_value_error() -> None:
    # A programming error (500), not the client's (400).
    with pytest.raises(ValueError, match="cannot build lock key") as caught:
        build_key("page:{slug.missing}", _page, ("x",), {})
    assert not isinstance(caught.value, InvalidLockNameError)


# -- binding a call to its parameters, worked out once per function ---------------------


def _reference_key(template: str, func: object, args: tuple, kwargs: dict) -> str:  # type: ignore[type-arg]
    """The name as ``inspect.Signature.bind`` makes it, every time."""
    import inspect  # noqa: PLC0415

    signature = inspect.signature(func)  # type: ignore[arg-type]
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(arguments.pop(name, {}))
    return template.format(**arguments)


def _plain(a: int, b: int = 2, *, c: int, d: int = 4) -> None:
    """Positional-or-keyword and keyword-only parameters, some with defaults."""


def _spread(a: int, *rest: int, **extra: int) -> None:
    """``*args`` and ``**kwargs``."""


def _positional_only(a: int, /, b: int = 7) -> None:
    """A positional-only parameter."""


@pytest.mark.parametrize(
    ("func", "template", "args", "kwargs"),
    [
        (_plain, "{a}-{b}-{c}-{d}", (1,), {"c": 3}),
        (_plain, "{a}-{b}-{c}-{d}", (), {"a": 1, "c": 3, "b": 5}),
        (_plain, "{a}-{b}-{c}-{d}", (1, 2), {"c": 3, "d": 9}),
        (_spread, "{a}-{rest}-{x}", (1, 2), {"x": 3}),
        (_positional_only, "{a}-{b}", (1,), {}),
    ],
)
def test_a_key_binds_as_the_signature_does(
    func: object,
    template: str,
    args: tuple,  # type: ignore[type-arg]
    kwargs: dict,  # type: ignore[type-arg]
) -> None:
    for _ in range(2):  # the first call works the binding out, the second reuses it
        assert build_key(template, func, args, kwargs) == _reference_key(  # type: ignore[arg-type]
            template, func, args, kwargs
        )


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),  # c missing
        ((1,), {}),  # c missing
        ((1, 2, 3), {"c": 1}),  # one positional too many
        ((1,), {"a": 1, "c": 2}),  # a given twice
        ((1,), {"c": 2, "e": 5}),  # no parameter e
    ],
)
def test_a_call_that_does_not_fit_raises_the_type_error_the_call_would(
    args: tuple,  # type: ignore[type-arg]
    kwargs: dict,  # type: ignore[type-arg]
) -> None:
    for _ in range(2):
        with pytest.raises(TypeError):
            build_key("{a}-{c}", _plain, args, kwargs)
