"""The admin's page of live locks, through Django's test client and in a real browser.

The browser test drives headless Chromium (Debian's ``chromium`` and
``chromium-driver``; ``.ci/run`` installs them) against a live server: a
superuser logs in, sees a lock another process holds, force-releases it after
the confirmation page, sees it gone, and the holding process is told its lock
was lost.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.staticfiles.testing import StaticLiveServerTestCase
from django.test import Client
from django.urls import reverse
from django.utils.html import escape
from pytest_django.fixtures import Settings as SettingsWrapper

from django_rlock._handler import locks

HANG = 20.0  # seconds: only ever reached when something hangs
CHANGELIST = "admin:django_rlock_lock_changelist"
FORCE_RELEASE = "admin:django_rlock_lock_force_release"

pytestmark = pytest.mark.django_db


def _user(*, superuser: bool = False, can_view: bool = False) -> User:
    name = "root" if superuser else ("viewer" if can_view else "staff")
    user = User.objects.create_user(name, password="secret-pass", is_staff=True)
    user.is_superuser = superuser
    user.save()
    if can_view:
        user.user_permissions.add(Permission.objects.get(codename="view_lock"))
    return user


def _client(user: User, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def test_staff_with_the_view_permission_see_the_held_locks_and_no_release_button(
    hold_elsewhere: Any,
) -> None:
    hold_elsewhere("order:42", lease=30)
    hold_elsewhere("invoice:7", lease=30)
    page = _client(_user(can_view=True)).get(reverse(CHANGELIST))
    assert page.status_code == 200
    body = page.content.decode()
    assert 'data-name="order:42"' in body and 'data-name="invoice:7"' in body
    assert "Force release" not in body
    searched = _client(_user(superuser=True)).get(reverse(CHANGELIST), {"q": "order"})
    assert 'data-name="order:42"' in searched.content.decode()
    assert 'data-name="invoice:7"' not in searched.content.decode()


def test_staff_without_the_permission_are_refused() -> None:
    assert _client(_user()).get(reverse(CHANGELIST)).status_code == 403


def test_only_a_superuser_may_force_release(hold_elsewhere: Any) -> None:
    hold_elsewhere("order:43", lease=30)
    viewer = _client(_user(can_view=True))
    target = {"alias": "default", "name": "order:43"}
    assert viewer.get(reverse(FORCE_RELEASE), target).status_code == 403
    assert viewer.post(reverse(FORCE_RELEASE), target).status_code == 403
    assert locks["default"].inspect("order:43") is not None


def test_a_force_release_needs_the_csrf_token_and_is_logged(hold_elsewhere: Any) -> None:
    hold_elsewhere("order:44", lease=30)
    root = _user(superuser=True)
    target = {"alias": "default", "name": "order:44"}
    assert _client(root, csrf=True).post(reverse(FORCE_RELEASE), target).status_code == 403
    assert locks["default"].inspect("order:44") is not None
    confirm = _client(root).get(reverse(FORCE_RELEASE), target)
    assert confirm.status_code == 200 and "order:44" in confirm.content.decode()
    done = _client(root).post(reverse(FORCE_RELEASE), target)
    assert done.status_code == 302 and done["Location"] == reverse(CHANGELIST)
    assert locks["default"].inspect("order:44") is None
    entry = LogEntry.objects.get()
    assert (entry.user.pk, entry.object_id, entry.action_flag) == (
        root.pk,
        "default:order:44",
        DELETION,
    )


def test_the_confirmation_shows_the_holder_as_the_list_does(hold_elsewhere: Any) -> None:
    hold_elsewhere("order:45", lease=30)
    info = locks["default"].inspect("order:45")
    assert info is not None
    root = _client(_user(superuser=True))
    listed = root.get(reverse(CHANGELIST)).content.decode()
    confirm = root.get(reverse(FORCE_RELEASE), {"alias": "default", "name": "order:45"})
    body = confirm.content.decode()
    shown = escape(info.holder_text())  # host pid N thread 'Thread-...'
    assert shown.startswith(f"{socket.gethostname()} pid {os.getpid()} thread ")
    assert f'<td class="holder">{shown}</td>' in listed
    assert f'<span class="holder">{shown}</span>' in body
    (digest,) = info.holders  # the owner-id digest it showed before
    assert digest not in body


def test_an_unreachable_alias_is_shown_as_such(settings: SettingsWrapper, redis_url: str) -> None:
    settings.RLOCKS = {**settings.RLOCKS, "down": {"LOCATION": "redis://127.0.0.1:1/0"}}
    page = _client(_user(superuser=True)).get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert "Cannot read this alias" in page.content.decode()


# -- in a real browser ------------------------------------------------------------

#: Holds one lock with a short watchdog in another process; prints "held",
#: then "lost" when the watchdog finds the lock gone.
HOLDER = textwrap.dedent(
    """
    import sys, threading
    from django_rlock.core import LockClient

    lost = threading.Event()
    with LockClient(sys.argv[1], key_prefix="t", watchdog_timeout=1.5) as client:
        lock = client.lock(sys.argv[2])
        lock.on_lost(lambda _lock: lost.set())
        assert lock.acquire()
        print("held", flush=True)
        print("lost" if lost.wait(30) else "never told", flush=True)
    """
)


def _browser() -> Any:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        reason = "Chromium or chromedriver is missing (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}: CI must run the browser test")
        pytest.skip(reason)
    from selenium import webdriver  # noqa: PLC0415 -- only where a browser runs
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(driver), options=options)


class TestAdminInABrowser(StaticLiveServerTestCase):
    """A superuser force-releases another process's lock from the admin page."""

    redis_url: str

    @pytest.fixture(autouse=True)
    def _server(self, redis_url: str) -> None:
        self.redis_url = redis_url

    def test_force_release_from_the_page_frees_the_lock_and_tells_the_holder(self) -> None:
        from selenium.webdriver.common.by import By  # noqa: PLC0415
        from selenium.webdriver.support import expected_conditions as shown  # noqa: PLC0415
        from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

        User.objects.create_superuser("root", password="secret-pass")
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, self.redis_url, "stuck:order:9"],
            stdout=subprocess.PIPE,
            text=True,
        )
        browser = _browser()
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "held"
            browser.get(f"{self.live_server_url}{reverse('admin:login')}")
            browser.find_element(By.NAME, "username").send_keys("root")
            browser.find_element(By.NAME, "password").send_keys("secret-pass")
            browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
            wait = WebDriverWait(browser, HANG)
            wait.until(shown.url_changes(f"{self.live_server_url}{reverse('admin:login')}"))
            browser.get(f"{self.live_server_url}{reverse(CHANGELIST)}")
            row = wait.until(
                shown.presence_of_element_located(
                    (By.CSS_SELECTOR, 'tr[data-name="stuck:order:9"]')
                )
            )
            # Who holds it: the other process, by host and pid.
            holder_cell = row.find_element(By.CLASS_NAME, "holder").text
            assert holder_cell.startswith(f"{socket.gethostname()} pid {holder.pid} ")
            row.find_element(By.CLASS_NAME, "force-release").click()
            confirm = wait.until(shown.element_to_be_clickable((By.ID, "confirm-force-release")))
            assert "stuck:order:9" in browser.find_element(By.ID, "content").text
            confirm.click()
            wait.until(shown.url_to_be(f"{self.live_server_url}{reverse(CHANGELIST)}"))
            wait.until(shown.text_to_be_present_in_element((By.ID, "main"), "was force-released"))
            assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-name="stuck:order:9"]')
            assert holder.stdout.readline().strip() == "lost"
        finally:
            browser.quit()
            holder.kill()
            holder.wait(HANG)
        assert LogEntry.objects.filter(object_id="default:stuck:order:9").count() == 1
