"""What one run owns, and gives back however it ends: processes, Redis, data, keys.

Everything the demo starts is registered here as soon as it exists, so that
:meth:`Session.stop` (run in a ``finally``, also on Ctrl-C) stops exactly that:
the worker (warm shutdown first) and the server with their process groups, the
embedded redis-server once nothing uses it, the data directory, and, in a Redis
given by ``REDIS_URL``, every key the run wrote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis
from django.db import connections
from django_rlock import locks
from django_rlock.backends._embedded_server import EmbeddedServer

from demo.outcomes import Stopped
from demo.processes import Managed


class Session:
    """One run's resources, registered as they are started."""

    def __init__(self, *, keep: bool) -> None:
        self.keep = keep
        self.data_dir = Path(tempfile.mkdtemp(prefix="shop-demo-"))
        self.redis_url = os.environ.get("REDIS_URL") or None
        suffix = uuid.uuid4().hex[:8]
        # A fresh embedded server is the demo's own; a given Redis may be shared.
        self.namespace = f"shop-demo-{suffix}" if self.redis_url else "shop"
        self.nodename = f"demo-{suffix}@localhost"
        self.redis = ""  # which Redis, for the last line of the report
        self.processes: list[Managed] = []
        self.embedded: EmbeddedServer | None = None
        self.embedded_pid = 0
        self.app: Any = None  # the shop's Celery app, once Django is set up
        self.task_ids: list[str] = []  # their results live outside the namespace

    def check_alive(self) -> None:
        """Raise if a process the demo started has exited."""
        for process in self.processes:
            if not process.running():
                raise RuntimeError(f"{process.name} exited during the run:\n{process.tail()}")

    def stop(self, *, interrupted: bool) -> Stopped:
        """Stop and remove everything registered; every step is bounded."""
        for process in reversed(self.processes):
            # The worker's warm shutdown lets running tasks release their locks.
            process.stop(5.0 if interrupted else 20.0)
        left_running = [p.name for p in self.processes if p.group_alive()]
        with contextlib.suppress(Exception):
            connections.close_all()
        with contextlib.suppress(Exception):
            locks.close_all()
        with contextlib.suppress(Exception):
            self.app.close()
        if self.embedded is not None:
            left_running += self.stop_embedded(self.embedded)
        elif self.redis_url:
            self.clean_shared_redis(self.redis_url)
        if self.keep:
            print(f"kept: {self.data_dir} (database, worker.log, server.log)")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return Stopped(left_running=tuple(left_running))

    def clean_shared_redis(self, url: str) -> None:
        """Delete what this run wrote in the Redis at REDIS_URL (all under its namespace)."""
        client = redis.Redis.from_url(url, socket_timeout=5)
        try:
            keys = list(client.scan_iter(match=f"{self.namespace}:*", count=1000))
            keys += [self.namespace, f"_kombu.binding.{self.namespace}"]
            keys.append(f"_kombu.binding_permanent.{self.namespace}")
            keys += [f"celery-task-meta-{task_id}" for task_id in self.task_ids]
            for start in range(0, len(keys), 500):
                client.delete(*keys[start : start + 500])
        except redis.RedisError as error:
            print(f"could not clean the namespace {self.namespace!r} in REDIS_URL: {error}")
        finally:
            client.close()

    def stop_embedded(self, server: EmbeddedServer) -> list[str]:
        """Let go of the embedded server; with every other process gone, it stops.

        What is left running: nothing, or the server if it had to be killed.
        """
        server.detach()
        pid = self.embedded_pid
        deadline = time.monotonic() + 15
        while pid and time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return []
            time.sleep(0.05)
        if not pid:
            return []
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return ["embedded redis-server (killed)"]
