"""Enqueue-time deduplication: ``once=True`` and ``once="queued"``.

An "equal task" is the same task name with the same lock key (built from the
signature-bound arguments, like the run lock). Each task name and key has one
marker, a Redis string in the lock's hash slot; the two modes keep theirs
apart, so a task whose mode changes between deploys never misreads the other's::

    <lock hash key>:once:<task name>     once=True       "queued:<id>" or "running:<id>"
    <lock hash key>:queued:<task name>   once="queued"   "queued:<id>"

``once=True``: one equal task queued or running.

* ``apply_async`` claims the marker as ``queued:<id>`` with an expiry of
  ``once_lease`` seconds; a claim that finds a live marker is a duplicate.
* The run takes its lock, then turns the marker into ``running:<id>``. From then
  on the marker is live only while the run lock exists, so a worker that dies
  (SIGKILL, hard time limit, lost machine) frees the name within the watchdog
  timeout, as it frees the lock: the marker is never stuck after a crash.
* A retry (``self.retry()``, ``on_busy="retry"``, a requeueing ``Reject``) puts
  the marker back to ``queued:<id>``; any other end of the run, and a revoke
  or expiry seen by the worker, deletes it.

``once="queued"``: one equal task queued; a run in progress blocks nothing.

* ``apply_async`` claims the marker as for ``once=True``.
* The run takes its lock, then deletes its marker: from then on one equal task
  may be queued again. A change made while a run is going therefore gets
  exactly one more run (the first enqueue after the run took its lock is
  accepted, the others are duplicates of it), and a task may enqueue itself
  from its own body. A follow-up that waits for the lock (``on_busy="retry"``
  or ``"wait"``) is still queued: it keeps its marker until it holds the lock.
* A retry puts ``queued:<id>`` back unless another equal task is queued by
  then (the retry is sent anyway: it is the same message going on); any other
  end of a run that never took its lock, a revoke or an expiry deletes it.

In both modes the marker expires after ``once_lease`` in every state, which
bounds how long a message lost by the broker can block its duplicates.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Final

from django_rlock.core._faces import escape, reported_unavailable
from django_rlock.core.exceptions import LockError

if TYPE_CHECKING:
    import redis

    from django_rlock.core import RLock

# KEYS[1] marker, KEYS[2] the run lock's hash. ARGV[1] task id, ARGV[2] expiry (ms).
# Returns nil when the marker now says queued:<id>, else the live marker's value.
# A running:<id> marker whose run lock is gone belongs to a dead run: claim it.
# (A once="queued" marker is never running:<id>.)
_CLAIM: Final = """
local current = redis.call('get', KEYS[1])
if current and current ~= 'queued:' .. ARGV[1] and current ~= 'running:' .. ARGV[1] then
    if string.sub(current, 1, 8) ~= 'running:' or redis.call('exists', KEYS[2]) == 1 then
        return current
    end
end
redis.call('set', KEYS[1], 'queued:' .. ARGV[1], 'px', ARGV[2])
return nil
"""

# KEYS[1] marker. ARGV[1] task id, ARGV[2] new state ('running', 'queued' or
# 'done'), ARGV[3] expiry (ms). Changes the marker only when it is this task's
# (or absent, for 'running' and 'queued'). Returns 1 when changed, else 0.
# once="queued" never asks for 'running': its run start is 'done'.
_MOVE: Final = """
local current = redis.call('get', KEYS[1])
if current and current ~= 'queued:' .. ARGV[1] and current ~= 'running:' .. ARGV[1] then
    return 0
end
if ARGV[2] == 'done' then
    redis.call('del', KEYS[1])
else
    redis.call('set', KEYS[1], ARGV[2] .. ':' .. ARGV[1], 'px', ARGV[3])
end
return 1
"""


class AlreadyQueued(LockError):
    """``apply_async`` of a ``once`` task while an equal task is queued (or running).

    ``once=True`` refuses while one is queued or running, ``once="queued"``
    only while one is queued. ``task_id`` is the id of that task
    (``task.AsyncResult(error.task_id)``).
    """

    def __init__(self, message: str, *, name: str | None = None, task_id: str) -> None:
        super().__init__(message, name=name)
        self.task_id = task_id


class OnceMarker:
    """The dedup marker of one task name and lock key, on the run lock's server.

    ``queued_only``: the marker of ``once="queued"`` (a run in progress does
    not hold it). Every method raises LockUnavailableError, naming the lock
    server, when that server cannot be reached.
    """

    def __init__(
        self, lock: RLock, task_name: str, lease: float, *, queued_only: bool = False
    ) -> None:
        self.lock = lock
        self.queued_only = queued_only
        slot = "queued" if queued_only else "once"
        self.key = f"{lock.keys.hash}:{slot}:{escape(task_name)}"
        self.lease_ms = max(1, math.ceil(lease * 1000))
        redis_client: redis.Redis = lock.client.redis
        self._server: str = lock.client.server
        self._claim = redis_client.register_script(_CLAIM)
        self._move = redis_client.register_script(_MOVE)

    def claim(self, task_id: str) -> str | None:
        """Mark ``task_id`` queued; None on success, else the id of the live equal task."""
        with reported_unavailable(self._server, "claim the once marker of", self.lock.name):
            current = self._claim(
                keys=[self.key, self.lock.keys.hash], args=[task_id, self.lease_ms]
            )
        if current is None:
            return None
        text = current.decode() if isinstance(current, bytes) else str(current)
        return text.split(":", 1)[1]

    def running(self, task_id: str) -> None:
        """The run of ``task_id`` holds its lock.

        ``once=True``: the marker now lives with that lock. ``once="queued"``:
        the task is no longer queued, so the marker is freed.
        """
        self._to(task_id, "done" if self.queued_only else "running")

    def requeued(self, task_id: str) -> None:
        """``task_id`` went back to the queue (a retry)."""
        self._to(task_id, "queued")

    def done(self, task_id: str) -> None:
        """``task_id`` finished, failed or was revoked: equal tasks may be queued again."""
        self._to(task_id, "done")

    def _to(self, task_id: str, state: str) -> None:
        with reported_unavailable(self._server, "update the once marker of", self.lock.name):
            self._move(keys=[self.key], args=[task_id, state, self.lease_ms])
