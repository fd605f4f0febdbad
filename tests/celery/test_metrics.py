"""Metrics from a Django-configured prefork worker: two children, one multiprocess directory."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from tests.celery import app as test_app
from tests.celery.conftest import open_gate, wait_started
from tests.celery.workers import Worker


@pytest.mark.slow
def test_locked_tasks_count_under_their_key_template_across_prefork_children(
    broker_url: str, store: redis.Redis, run: str, tmp_path: Path
) -> None:
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.celery.django_settings",
        "RLOCK_TEST_METRICS": "prometheus",
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
    }
    queue = f"metrics-{run}"
    with Worker(broker_url, env=env, queue=queue, concurrency=2):
        holder = test_app.critical_raise.apply_async((run,), {"gate": True}, queue=queue)
        wait_started(store, run)
        # The other child finds the lock held: on_busy="raise" makes one attempt.
        contender = test_app.critical_raise.apply_async((run,), queue=queue)
        with pytest.raises(Exception, match="busy"):
            contender.get(timeout=20)
        open_gate(store, run)
        holder.get(timeout=20)
        # django_rlock's @locked under @app.task is labelled by its template too.
        test_app.critical_django_decorated.apply_async((run,), queue=queue).get(timeout=20)

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]  # untyped upstream

        def value(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, {"alias": "default", **labels})

        template = "crit:{run}"  # never the run's own name, crit:<run id>
        acquisitions = "django_rlock_acquisitions_total"
        assert value(acquisitions, lock=template, outcome="acquired") == 2
        assert value(acquisitions, lock=template, outcome="busy") == 1
        assert value("django_rlock_hold_seconds_count", lock=template) == 2
        assert value("django_rlock_wait_seconds_count", lock=template) == 3
        assert value("django_rlock_held", lock=template) == 0
        assert value(acquisitions, lock=f"crit:{run}", outcome="acquired") is None
    # Each child wrote its own files; the collector served their sum.
    assert len(list(tmp_path.glob("counter_*.db"))) >= 2
