"""A missing ``LockErrorMiddleware`` is told: a check (W020), and once at run time.

``django_rlock.W020`` (every check run, tagged ``urls``): a view of the URLconf takes a lock with
``rlock()``, ``semaphore()`` or ``locks[...]`` while ``MIDDLEWARE`` has no
``LockErrorMiddleware``, so a busy lock there answers 500, not 409. At run time,
the first lock error of each class that escapes a view unanswered is logged
once on ``django_rlock``, naming the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import run_checks
from django.test import Client, override_settings

from django_rlock import _checks
from django_rlock.middleware import LockErrorMiddleware
from django_rlock.testing import held_elsewhere

MIDDLEWARE = "django_rlock.middleware.LockErrorMiddleware"


def w020(**overrides: Any) -> list[str]:
    """The W020 messages of ``manage.py check`` (every tag) under ``overrides``."""
    with override_settings(**overrides):
        found = run_checks()
        return [m.msg for m in found if m.id == "django_rlock.W020"]


def test_views_taking_locks_without_the_middleware_are_warned() -> None:
    messages = w020(ROOT_URLCONF="tests.django.missing_pieces_urls", MIDDLEWARE=[])

    assert len(messages) == 1
    assert (
        "Views take locks with rlock(), semaphore() or locks[...] "
        "(tests.django.missing_pieces_urls.RefundView.post, "
        "tests.django.missing_pieces_urls.pay) but MIDDLEWARE has no LockErrorMiddleware"
    ) in messages[0]


def test_the_middleware_or_views_without_rlock_silence_it() -> None:
    urls = "tests.django.missing_pieces_urls"
    assert w020(ROOT_URLCONF=urls, MIDDLEWARE=[MIDDLEWARE]) == []
    # A subclass of it answers the same errors.
    assert w020(ROOT_URLCONF=urls, MIDDLEWARE=[f"{__name__}.OwnMiddleware"]) == []
    # @locked answers its own lock's errors; a function of the project's called rlock is not ours.
    assert w020(ROOT_URLCONF="tests.django.missing_pieces_clean_urls", MIDDLEWARE=[]) == []


def test_it_runs_with_every_check_run_as_a_check_of_the_urls() -> None:
    # Run by runserver and every command that checks, as Django's URLconf checks are
    # (it was `check --deploy` only: a developer saw it only at the first busy lock),
    # and not by `check --tag django_rlock` (the settings alone).
    with override_settings(ROOT_URLCONF="tests.django.missing_pieces_urls", MIDDLEWARE=[]):
        assert [m.id for m in run_checks()].count("django_rlock.W020") == 1
        assert [m.id for m in run_checks(tags=["urls"])].count("django_rlock.W020") == 1
        assert "django_rlock.W020" not in [m.id for m in run_checks(tags=["django_rlock"])]


class OwnMiddleware(LockErrorMiddleware):
    """A project's own subclass of the middleware."""


@pytest.fixture
def told() -> Iterator[None]:
    """Each test starts with nothing told yet (the hint is once per process)."""
    _checks._told.clear()
    yield
    _checks._told.clear()


@pytest.mark.usefixtures("rlocks", "told")
def test_a_lock_error_escaping_a_view_is_told_once(caplog: pytest.LogCaptureFixture) -> None:
    client = Client(raise_request_exception=False)
    with (
        override_settings(ROOT_URLCONF="tests.django.missing_pieces_urls", MIDDLEWARE=[]),
        caplog.at_level(logging.WARNING, logger="django_rlock"),
        held_elsewhere("order:1"),
    ):
        first = client.get("/orders/pay/1/")
        second = client.get("/orders/pay/1/")

    assert first.status_code == second.status_code == 500
    hints = [r.getMessage() for r in caplog.records if r.name == "django_rlock"]
    assert hints == [
        "LockTimeout escaped the view of /orders/pay/1/ and answers 500: add "
        "'django_rlock.middleware.LockErrorMiddleware' to MIDDLEWARE to answer lock errors "
        "(a busy lock: 409 with Retry-After; its server down: 503), or lock the view with "
        "@locked (told once per error class)"
    ]


@pytest.mark.usefixtures("rlocks", "told")
def test_with_the_middleware_nothing_is_told(caplog: pytest.LogCaptureFixture) -> None:
    client = Client(raise_request_exception=False)
    with (
        override_settings(ROOT_URLCONF="tests.django.missing_pieces_urls", MIDDLEWARE=[MIDDLEWARE]),
        caplog.at_level(logging.WARNING, logger="django_rlock"),
        held_elsewhere("order:1"),
    ):
        busy = client.get("/orders/pay/1/")

    assert busy.status_code == 409
    assert [r for r in caplog.records if r.name == "django_rlock"] == []
