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
