"""A misspelt LockedTask option fails where the task is defined, with the close match.

Celery turns each keyword of ``@app.task`` into a class attribute, so
``lok_timeout=3`` used to be kept and ignored: the task ran with the default
(no timeout). Celery's own options and a subclass's own methods and
attributes stay accepted.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_rlock import LockedTask

pytestmark = pytest.mark.pure


def define(**options: Any) -> Any:
    app = Celery("option-names-test", set_as_current=False)

    # shared=False: a deliberately broken task must not reach other apps.
    @app.task(base=LockedTask, shared=False, **options)  # type: ignore[untyped-decorator]
    def pay(order_id: int) -> None: ...

    return pay.name  # evaluates the lazy task, which binds and checks it


@pytest.mark.parametrize(
    ("option", "suggested"),
    [
        ("lok_timeout", "lock_timeout"),
        ("lock_timout", "lock_timeout"),
        ("on_buys", "on_busy"),
        ("onbusy", "on_busy"),
        ("lock_perms", "lock_permits"),
        ("once_leas", "once_lease"),
        ("locks", "lock"),
    ],
)
def test_a_misspelt_option_is_refused_naming_it_and_the_close_match(
    option: str, suggested: str
) -> None:
    with pytest.raises(ValueError, match="is not a LockedTask option") as caught:
        define(lock="order:{order_id}", **{option: 3})
    message = str(caught.value)
    assert f"{option!r} is not a LockedTask option (did you mean {suggested!r}?)" in message
    assert "lock_timeout" in message  # the options are listed


def test_an_unknown_name_in_lockedtasks_namespace_is_refused() -> None:
    with pytest.raises(ValueError, match=r"'lock_wait' is not a LockedTask option; the options"):
        define(lock="order:{order_id}", lock_wait=3)


def test_celerys_own_options_are_accepted() -> None:
    assert define(
        lock="order:{order_id}",
        lock_timeout=3,
        max_retries=3,
        acks_late=True,
        autoretry_for=(ConnectionError,),
        retry_backoff=True,
        retry_jitter=False,
        rate_limit="10/s",
        time_limit=60,
        ignore_result=True,
    ).endswith("pay")


def test_a_class_based_task_is_checked_too() -> None:
    app = Celery("option-names-test", set_as_current=False)

    class Sync(LockedTask):
        name = "sync"
        lock = "sync:{account}"
        lok_timeout = 10

        def run(self, account: str) -> None: ...

    with pytest.raises(ValueError, match=r"'lok_timeout' is not a LockedTask option"):
        app.register_task(Sync())


def test_a_subclass_keeps_its_own_methods_and_attributes() -> None:
    app = Celery("option-names-test", set_as_current=False)

    class Report(LockedTask):
        name = "report"
        lock = "report:{customer}"
        block = 4  # its own attribute, not a misspelt "lock"
        output_format = "pdf"

        def lock_name_for(self, customer: str) -> str:
            return f"report:{customer}"

        @staticmethod
        def once_more() -> bool:
            return True

        def run(self, customer: str) -> None: ...

    registered = app.register_task(Report())
    assert registered.lock_options is not None
