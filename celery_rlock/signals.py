"""Signals of celery_rlock, sent in the worker child that runs the task.

Celery's own signal class (:class:`celery.utils.dispatch.Signal`), so they work
with or without Django; connect as to Celery's signals::

    from celery_rlock.signals import duplicate_dropped

    @duplicate_dropped.connect
    def audit(sender, task_id, lock, found, **kwargs): ...

The lock signals of a Django project (``lock_acquired``, ``lock_lost``,
``lock_leaked``...) are :mod:`django_rlock.signals`; they are sent for task
locks too.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["duplicate_dropped"]

#: Sent when a delivery of a locked task's message is dropped as a duplicate
#: of a run of the same task id (see :mod:`celery_rlock._delivery`). ``sender``
#: is the task; arguments: ``task_id``, ``lock`` (the lock name), ``found``
#: (``"running"``: a live run holds the lock; ``"finished"``: a run has ended)
#: and ``request`` (the dropped delivery's request: ``args``, ``kwargs``,
#: ``delivery_info``...).
duplicate_dropped = Signal(
    name="duplicate_dropped",
    providing_args={"task_id", "lock", "found", "request"},
)
