"""Mistakes in a task's lock options fail when the task is defined, not when it runs."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_rlock import LockedTask, locked
from celery_rlock._decorators import options_of
from celery_rlock._guard import TaskLockOptions
from django_rlock import locked as django_locked
from tests.celery import app as test_app

pytestmark = pytest.mark.pure


def define(**options: Any) -> Any:
    app = Celery("definition-test", set_as_current=False)

    # shared=False: a deliberately broken task must not be bound to every app
    # created later in this process (Celery shares tasks across apps by default).
    @app.task(base=LockedTask, shared=False, **options)  # type: ignore[untyped-decorator]
    def pay(order_id: int, amount: int = 0) -> None: ...

    return pay.name  # evaluates the lazy task, which binds and checks it


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lock": "order:{oder_id}"}, "has no parameter 'oder_id'"),
        ({"lock": "order:{}"}, "not by position"),
        ({"lock": "order:{order_id}", "on_busy": "later"}, "on_busy must be one of"),
        ({"lock": "order:{order_id}", "on_lost": "ignore"}, "on_lost must be one of"),
        ({"lock": "order:{order_id}", "lock_timeout": -1}, "lock_timeout must be >= 0"),
        ({"lock": "order:{order_id}", "lock_lease": 0}, "lock_lease must be > 0"),
        ({"lock": "order:{order_id}", "lock_using": ""}, "lock_using must be"),
        ({"once": True}, "once=True needs a lock key template"),
        ({"lock": "o:{order_id}", "once": True, "once_on_duplicate": "x"}, "once_on_duplicate"),
    ],
)
def test_bad_lock_options_fail_at_definition(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        define(**options)


def test_good_options_define_a_task() -> None:
    assert define(lock=lambda order_id, amount=0: f"order:{order_id}", on_busy="skip").endswith(
        "pay"
    )


def test_locked_refuses_to_sit_above_the_task_decorator() -> None:
    app = Celery("definition-test", set_as_current=False)

    def charge(order_id: int) -> None: ...

    task = app.task(charge)
    with pytest.raises(TypeError, match=r"put @locked under @app\.task"):
        locked("order:{order_id}")(task)


def test_locked_checks_its_template_at_decoration() -> None:
    def charge(order_id: int) -> None: ...

    with pytest.raises(ValueError, match="has no parameter 'id'"):
        locked("order:{id}")(charge)


def test_django_rlock_locked_above_the_task_decorator_says_what_to_write() -> None:
    app = Celery("definition-test", set_as_current=False)

    def charge(order_id: int) -> None: ...

    for task in (app.task(charge), app.task(shared=False)(charge)):
        with pytest.raises(TypeError) as caught:
            django_locked("order:{order_id}")(task)
        assert "put @locked under the task decorator" in str(caught.value)
        assert "    @app.task  # or @shared_task\n    @locked('order:{order_id}')" in str(
            caught.value
        )


def test_django_rlock_locked_under_the_task_decorator_keeps_the_task() -> None:
    task = test_app.critical_django_decorated
    assert hasattr(task, "delay")
    assert options_of(task) == TaskLockOptions.build(
        "crit:{run}", task.run, timeout=None, lease=None, using="default"
    )


def test_locked_checks_on_lost_at_decoration() -> None:
    def charge(order_id: int) -> None: ...

    with pytest.raises(ValueError, match="on_lost must be one of"):
        locked("order:{order_id}", on_lost="raise")(charge)  # type: ignore[arg-type]
