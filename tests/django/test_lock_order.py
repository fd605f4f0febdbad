"""The lock order check in the Django face: RLOCK_LOCK_ORDER_CHECK, templates, the pytest plugin.

With the setting on, locks taken through ``@locked`` and
``rlock(template, **fields)`` are ordered by their key templates, so
``order:1`` then ``customer:7`` in one view and ``customer:8`` then
``order:2`` in another is the inversion it is, although the ids differ and no
deadlock happened. The engine's check is tested in tests/process/test_lock_order.py.
"""

# ruff: noqa: SIM117 -- nested on purpose: each lock's own line is the call site a warning names

from __future__ import annotations

import asyncio
import textwrap
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock import LockOrderWarning, locked, locks, rlock
from django_rlock.backends.base import BaseLockBackend
from django_rlock.core._process.lockorder import lock_order
from django_rlock.exceptions import LockSettingError
from tests.django.conftest import HANG

pytest_plugins = ["pytester"]


@pytest.fixture
def caught(settings: SettingsWrapper) -> Iterator[list[warnings.WarningMessage]]:
    """The check on, an empty graph, and every warning of the test."""
    settings.RLOCK_LOCK_ORDER_CHECK = True
    lock_order.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen
    lock_order.reset()


def inversions(seen: list[warnings.WarningMessage]) -> list[LockOrderWarning]:
    return [w.message for w in seen if isinstance(w.message, LockOrderWarning)]


@locked("order:{order_id}")
def pay(order_id: int, customer_id: int) -> None:
    with rlock("customer:{customer_id}", customer_id=customer_id):
        pass


@locked("customer:{customer_id}")
def close_account(customer_id: int, order_id: int) -> None:
    with rlock("order:{order_id}", order_id=order_id):
        pass


def in_thread(target: Any, *args: Any) -> None:
    thread = threading.Thread(target=target, args=args)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive()


def test_templates_in_opposite_orders_warn_whatever_the_ids(
    rlocks: dict[str, Any], caught: list[warnings.WarningMessage]
) -> None:
    in_thread(pay, 1, 7)
    in_thread(pay, 2, 8)
    assert inversions(caught) == []
    in_thread(close_account, 9, 3)  # other ids, the opposite order of templates
    (warning,) = inversions(caught)
    now, earlier = warning.cycle
    assert (earlier.held, earlier.taken) == ("order:{order_id}", "customer:{customer_id}")
    assert (now.held, now.taken) == ("customer:{customer_id}", "order:{order_id}")
    assert (now.taken_at.filename, now.taken_at.function) == (__file__, "close_account")
    assert (earlier.taken_at.filename, earlier.taken_at.function) == (__file__, "pay")
    assert "'order:{order_id}'" in str(warning) and "close_account" in str(warning)
    in_thread(close_account, 10, 4)
    assert len(inversions(caught)) == 1  # told once


def test_nested_ids_of_one_template_and_reentry_are_no_inversion(
    rlocks: dict[str, Any], caught: list[warnings.WarningMessage]
) -> None:
    def merge(first: int, second: int) -> None:
        with rlock("order:{order_id}", order_id=first):
            with rlock("order:{order_id}", order_id=second):  # lockdep's "nested"
                with rlock("order:{order_id}", order_id=first):  # re-entry
                    pass

    in_thread(merge, 1, 2)
    in_thread(merge, 2, 1)
    assert inversions(caught) == []
    assert lock_order.edges == 0


def test_off_by_default(rlocks: dict[str, Any], settings: SettingsWrapper) -> None:
    lock_order.reset()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        in_thread(pay, 1, 7)
        in_thread(close_account, 7, 1)
    assert inversions(seen) == []
    assert lock_order.edges == 0
    backend = locks["default"]
    assert isinstance(backend, BaseLockBackend) and backend.lock_order_check is False


def test_async_views_code_is_checked_by_template_too(
    rlocks: dict[str, Any], caught: list[warnings.WarningMessage]
) -> None:
    async def pay_async(order_id: int, customer_id: int) -> None:
        async with rlock("order:{order_id}", order_id=order_id):
            async with rlock("customer:{customer_id}", customer_id=customer_id):
                await asyncio.sleep(0)

    async def refund_async(order_id: int, customer_id: int) -> None:
        async with rlock("customer:{customer_id}", customer_id=customer_id):
            async with rlock("order:{order_id}", order_id=order_id):
                await asyncio.sleep(0)

    asyncio.run(asyncio.wait_for(pay_async(1, 7), HANG))
    assert inversions(caught) == []
    asyncio.run(asyncio.wait_for(refund_async(2, 8), HANG))
    (warning,) = inversions(caught)
    now, earlier = warning.cycle
    assert (now.held, now.taken) == ("customer:{customer_id}", "order:{order_id}")
    assert (now.taken_at.filename, now.taken_at.function) == (__file__, "refund_async")
    assert (earlier.taken_at.filename, earlier.taken_at.function) == (__file__, "pay_async")


@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_bad_setting_is_refused_and_checked(settings: SettingsWrapper, value: object) -> None:
    settings.RLOCK_LOCK_ORDER_CHECK = value
    with pytest.raises(LockSettingError, match=r"RLOCK_LOCK_ORDER_CHECK must be True or False"):
        locks["default"].lock("x")
    with pytest.raises(SystemCheckError, match=r"django_rlock\.E009"):
        call_command("check", "--tag", "django_rlock")


# -- the pytest plugin ---------------------------------------------------------------

SETTINGS = """
SECRET_KEY = "user-project"
INSTALLED_APPS = ["django_rlock"]
DATABASES = {}
USE_TZ = True
RLOCKS = {"default": {"LOCATION": "redis://127.0.0.1:1/0", "KEY_PREFIX": "shop"}}
RLOCK_LOCK_ORDER_CHECK = True
"""

USER_TESTS = """
from django_rlock import rlock


def test_pay(rlocks):
    with rlock("order:{id}", id=1):
        with rlock("customer:{id}", id=7):
            pass


def test_refund(rlocks):
    with rlock("customer:{id}", id=8):
        with rlock("order:{id}", id=2):
            pass


def test_after(rlocks):
    with rlock("order:{id}", id=3):
        with rlock("customer:{id}", id=9):
            pass
"""


def line_of(code: str) -> int:
    """The line of the user's tests that holds ``code`` (pytester strips the leading newline)."""
    lines = USER_TESTS.strip().splitlines()
    return next(number for number, line in enumerate(lines, 1) if code in line)


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A user's project whose settings turn the check on; its tests invert one order."""
    pytester.makepyfile(shop_settings=SETTINGS, test_shop=USER_TESTS)
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "shop_settings")
    return pytester


def test_the_plugin_fails_the_test_that_inverts_when_the_warning_is_an_error(
    project: pytest.Pytester,
) -> None:
    project.makeini(
        textwrap.dedent(
            """
            [pytest]
            filterwarnings =
                error::django_rlock.LockOrderWarning
            """
        )
    )

    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*LockOrderWarning: lock order inversion: 'order:{id}' was taken while holding "
            "'customer:{id}'*",
            "*FAILED test_shop.py::test_refund*",
        ]
    )
    inverted, first = line_of('"order:{id}", id=2'), line_of('"customer:{id}", id=7')
    assert f"test_shop.py:{inverted} in test_refund" in result.stdout.str()
    assert f"test_shop.py:{first} in test_pay" in result.stdout.str()


def test_without_the_error_filter_the_plugin_only_warns(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")

    result.assert_outcomes(passed=3, warnings=1)
    inverted = line_of('"order:{id}", id=2')
    result.stdout.fnmatch_lines(
        [f"*test_shop.py:{inverted}: LockOrderWarning: lock order inversion*"]
    )
