"""``django_rlock.testing``, as a user's project meets it: pytest runs in a project of its own.

Each test writes a small project (settings, a ``@locked`` view, its tests) and
runs pytest on it in a subprocess, as the user would: the plugin comes from
the installed distribution's ``pytest11`` entry point, not from anything the
project declares, and the project's RLOCKS name a server that does not exist,
so only the ``rlocks`` fixture makes its locks work.
"""

from __future__ import annotations

import importlib.metadata
import textwrap

import pytest

pytest_plugins = ["pytester"]

#: The user's settings: RLOCKS on servers that are not there (port 1).
SETTINGS = """
SECRET_KEY = "user-project"
ROOT_URLCONF = "shop_urls"
INSTALLED_APPS = ["django_rlock"]
DATABASES = {}
USE_TZ = True
RLOCKS = {
    "default": {"LOCATION": "redis://127.0.0.1:1/0", "KEY_PREFIX": "shop", "WATCHDOG_TIMEOUT": 7},
    "same": {"LOCATION": "redis://127.0.0.1:1/0", "KEY_PREFIX": "shop"},
    "reports": {"LOCATION": "redis://127.0.0.1:1/1", "KEY_PREFIX": "shop", "MIN_REPLICAS": 1},
}
"""

URLS = """
from django.http import HttpResponse
from django.urls import path

from django_rlock import locked


@locked("order:{order_id}", timeout=0)
def pay(request, order_id):
    return HttpResponse("paid")


urlpatterns = [path("orders/<int:order_id>/pay/", pay)]
"""

#: The user's tests, in the order pytest runs them.
USER_TESTS = """
import pytest
from django.conf import settings

from django_rlock import locks, rlock
from django_rlock.backends.embedded import EmbeddedRedisLockBackend
from django_rlock.core import LockTimeout
from django_rlock.testing import held_elsewhere


def test_a_busy_order_answers_409_then_200_once_free(client, rlocks):
    with held_elsewhere("order:1"):
        busy = client.post("/orders/1/pay/")
    assert busy.status_code == 409
    assert int(busy["Retry-After"]) >= 1
    assert client.post("/orders/1/pay/").status_code == 200


def test_every_alias_is_on_the_sessions_server(rlocks, rlocks_server):
    assert set(rlocks) == {"default", "same", "reports"}
    for alias in rlocks:
        backend = locks[alias]
        assert isinstance(backend, EmbeddedRedisLockBackend)
        assert backend.location == rlocks_server.location
    # Settings kept; the store: same server and prefix share, another server is apart.
    assert locks["default"].watchdog_timeout == 7
    assert locks["default"].key_prefix == locks["same"].key_prefix == "shop"
    assert locks["reports"].key_prefix == "shop:reports"
    assert locks["reports"].min_replicas == 0
    with locks["default"].lock("x"):
        assert locks["same"].lock("x").locked()
        assert not locks["reports"].lock("x").locked()


def test_the_test_thread_is_not_the_holder(rlocks):
    with held_elsewhere("report:9", using="reports"):
        lock = locks["reports"].lock("report:9")
        assert lock.locked() and not lock.owned()
        assert not lock.acquire(blocking=False)  # no re-entry: another owner holds it
        with pytest.raises(LockTimeout):
            with rlock("report:9", using="reports", timeout=0):
                pass
    assert not locks["reports"].lock("report:9").locked()


def test_a_hold_is_given_back_when_the_body_raises(rlocks):
    with pytest.raises(ZeroDivisionError):
        with held_elsewhere("order:2"):
            1 / 0
    assert not locks["default"].lock("order:2").locked()


def test_a_lock_left_held_by_a_test_a(rlocks):
    assert locks["default"].lock("left").acquire(lease=60)


def test_a_lock_left_held_by_a_test_b(rlocks):
    assert not locks["default"].lock("left").locked()  # each test starts empty


def test_held_elsewhere_tells_when_it_cannot_take_the_lock(rlocks):
    with rlock("mine"):
        with pytest.raises(LockTimeout, match="held_elsewhere could not take lock 'mine'"):
            with held_elsewhere("mine", timeout=0.2):
                pass


def test_without_the_fixture_the_settings_are_the_projects():
    assert settings.RLOCKS["default"]["LOCATION"] == "redis://127.0.0.1:1/0"
"""


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A user's project: settings, a locked view, no conftest and no plugin declared."""
    pytester.makepyfile(shop_settings=SETTINGS, shop_urls=URLS)
    # The suite's own DJANGO_SETTINGS_MODULE must not reach the user's pytest.
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "shop_settings")
    return pytester


def test_the_plugin_is_registered_by_the_distribution() -> None:
    plugins = importlib.metadata.entry_points(group="pytest11")
    assert [(ep.name, ep.value) for ep in plugins if ep.value.startswith("django_rlock")] == [
        ("django_rlock", "django_rlock.testing")
    ]


def test_a_users_tests_check_409_and_200_with_rlocks_and_held_elsewhere(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(test_shop=USER_TESTS)

    result = project.runpytest_subprocess("-p", "no:cacheprovider")

    result.assert_outcomes(passed=8)


def test_plain_pytest_without_pytest_django(project: pytest.Pytester) -> None:
    # The plugin loads with no Django settings at all; the fixture works once
    # the project configures settings itself.
    project.makeconftest(
        """
        import django
        from django.conf import settings

        import shop_settings

        settings.configure(**{k: v for k, v in vars(shop_settings).items() if k.isupper()})
        django.setup()
        """
    )
    project.makepyfile(
        test_plain=textwrap.dedent(
            """
            from django_rlock import locks
            from django_rlock.testing import held_elsewhere

            def test_a_lock_with_no_django_plugin(rlocks):
                with held_elsewhere("order:1"):
                    assert not locks["default"].lock("order:1").acquire(blocking=False)
            """
        )
    )

    result = project.runpytest_subprocess("-p", "no:django", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)


def test_the_plugin_needs_no_settings_to_load(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing_to_do_with_locks():\n    assert True\n")

    result = pytester.runpytest_subprocess("-p", "no:django", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=1)


def test_rlocks_without_settings_says_what_to_do(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    pytester.makepyfile("def test_locks(rlocks):\n    pass\n")

    result = pytester.runpytest_subprocess("-p", "no:django", "-p", "no:cacheprovider")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*django_rlock.testing needs Django settings*"])
