"""Configuration: Celery-only settings, Django settings, and failing at worker start."""

from __future__ import annotations

import json
import types

import pytest
import redis
from celery import Celery

from celery_rlock import LockedTask
from celery_rlock._conf import CelerySettings, ConfigurationError, uses_django
from celery_rlock._worker import LockStep, check_pool
from tests.celery import app as test_app
from tests.celery.conftest import lock_key, open_gate, wait_started
from tests.celery.workers import Worker


def make_app(**conf: object) -> Celery:
    app = Celery("conf-test", set_as_current=False)
    app.conf.update(conf)
    return app


@pytest.mark.pure
def test_rlock_url_falls_back_to_a_redis_broker_url() -> None:
    settings = CelerySettings.from_app(make_app(broker_url="redis://127.0.0.1:7/3"))
    assert settings == CelerySettings("redis://127.0.0.1:7/3", "rlock", 30.0)


@pytest.mark.pure
def test_rlock_settings_win_over_the_broker() -> None:
    app = make_app(
        broker_url="amqp://guest@localhost//",
        rlock_url="rediss://locks.example:6380/0",
        rlock_key_prefix="shop",
        rlock_watchdog_timeout=5,
    )
    assert CelerySettings.from_app(app) == CelerySettings(
        "rediss://locks.example:6380/0", "shop", 5.0
    )
    assert not uses_django(app)  # an explicit rlock_url wins over Django settings


@pytest.mark.pure
@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"broker_url": "amqp://guest:secret@localhost//"}, "set the Celery setting rlock_url"),
        ({"rlock_url": "http://x"}, "rlock_url must be a redis://"),
        (
            {"rlock_url": "redis://h/0", "rlock_watchdog_timeout": 0},
            "rlock_watchdog_timeout must be > 0",
        ),
        ({"rlock_url": "redis://h/0", "rlock_key_prefix": "a{b}"}, "rlock_key_prefix must not"),
    ],
)
def test_bad_settings_are_reported_by_name(conf: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as raised:
        CelerySettings.from_app(make_app(**conf))
    assert "secret" not in str(raised.value)


@pytest.mark.pure
@pytest.mark.parametrize("pool", ["gevent", "eventlet"])
def test_green_pools_are_refused(pool: str) -> None:
    # The pool module itself needs gevent/eventlet installed; the check needs
    # only the class's module, which is how a worker names its pool.
    pool_class = type("TaskPool", (), {"__module__": f"celery.concurrency.{pool}"})
    with pytest.raises(ConfigurationError, match=f"does not support the {pool} pool"):
        check_pool(pool_class)


@pytest.mark.pure
def test_a_rate_limited_task_without_a_lock_is_checked_at_worker_start() -> None:
    app = make_app(rlock_url="redis://127.0.0.1:7/0")

    @app.task(base=LockedTask, lock_rate="10/m", lock_using="reports", shared=False)  # type: ignore[untyped-decorator]
    def report() -> None: ...

    app.finalize()
    worker = types.SimpleNamespace(app=app, pool_cls=None)  # what the step reads of it
    # Without Django settings there is one lock server: "reports" names none.
    with pytest.raises(ConfigurationError, match="lock_using='reports': without Django"):
        LockStep(worker)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RLOCK_TEST_WATCHDOG_TIMEOUT": "-1"}, "rlock_watchdog_timeout must be > 0"),
        ({"RLOCK_TEST_RLOCK_URL": "memcached://127.0.0.1:1"}, "rlock_url must be a redis://"),
    ],
)
def test_a_misconfigured_worker_fails_at_start(
    broker_url: str, env: dict[str, str], message: str
) -> None:
    worker = Worker(broker_url, env=env)
    worker.start(wait_ready=False)
    try:
        assert worker.wait_exit(timeout=60) != 0
        assert message in worker.output()
        assert "ready." not in worker.output()
    finally:
        worker.stop()
        worker.log.unlink(missing_ok=True)


@pytest.mark.slow
def test_a_django_configured_worker_takes_locks_from_rlocks(
    broker_url: str, store: redis.Redis, run: str
) -> None:
    env = {"DJANGO_SETTINGS_MODULE": "tests.celery.django_settings"}
    queue = f"django-{run}"
    with Worker(broker_url, env=env, queue=queue) as django_worker:
        holder = test_app.critical_raise.apply_async((run,), {"gate": True}, queue=queue)
        wait_started(store, run)
        # RLOCKS["default"]["KEY_PREFIX"] is "djtest"; the Celery-only prefix is "ctest".
        assert store.exists(f"djtest:{{crit:{run}}}")
        assert not store.exists(lock_key(f"crit:{run}"))
        contender = test_app.critical_raise.apply_async((run,), queue=queue)
        with pytest.raises(Exception, match="busy"):
            contender.get(timeout=20)
        open_gate(store, run)
        holder.get(timeout=20)
        assert not store.exists(f"djtest:{{crit:{run}}}")
        # Wait and hold times reach the django_rlock signals and the task's log.
        signals = [json.loads(raw) for raw in store.lrange(f"ctest:signals:crit:{run}", 0, -1)]
        assert [kind for kind, _ in signals] == ["acquired", "released"]
        assert all(seconds >= 0 for _, seconds in signals)
        log = django_worker.output()
        assert f"lock 'crit:{run}' acquired after waiting" in log
        assert f"lock 'crit:{run}' released after holding" in log
        assert f"lock 'crit:{run}' busy after waiting" in log
