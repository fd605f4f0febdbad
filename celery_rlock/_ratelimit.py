"""A task's global rate limit: ``LockedTask``'s ``lock_rate`` and ``lock_rate_key``.

::

    @app.task(base=LockedTask, lock_rate="100/m", lock_rate_key="partner:{tenant_id}")
    def call_partner(tenant_id, payload): ...

Celery's own ``rate_limit`` is per worker instance; this one is shared by
every worker on the lock server, per key (the rate limiter of
:meth:`LockClient.rate_limiter <django_rlock.core.LockClient.rate_limiter>`,
default burst: the rate's count). The key template defaults to the task's
``lock`` template, else its name (one limit for the whole task).

A worker run whose permit is not due yet does not wait in its pool slot, nor
retry on a guess: its permit is *reserved* for the time it is due, and the task
re-queued with exactly that countdown, carrying the header
:data:`RESERVED_HEADER`; that retry runs without asking again (no ping-pong
of retries, however many tasks queue for one key). Celery's ``max_retries``
applies: a run with no retry left takes a permit only if one is free now,
and otherwise fails with :class:`~django_rlock.exceptions.RateLimitExceeded`
(a ``LockTimeout``) naming the limit. A run starts at its permit's time or later (later when every
worker slot is busy then), never earlier.

A task called directly (``task(...)``) or eagerly waits for its permit in the
caller (``acquire()``). The limit is passed before the task's lock is taken;
a lock server that cannot be reached is handled by ``on_unavailable``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from celery.utils.log import get_task_logger

from celery_rlock._conf import get_rate_limiter
from celery_rlock._guard import unavailable_countdown
from django_rlock._celeryface import (
    AliasRateLimiter,
    KeyTemplate,
    build_key,
    check_template,
    template_label,
)
from django_rlock.core._faces import parse_rate
from django_rlock.core.exceptions import LockUnavailableError, RateLimitExceeded

if TYPE_CHECKING:
    from celery import Celery

logger = get_task_logger("celery_rlock")

#: The header of a run re-queued for its reserved permit: ``[limiter name,
#: the retry count that holds it]``. Only that retry of that message uses it.
RESERVED_HEADER: Final = "rlock_rate_reserved"


@dataclass(frozen=True, slots=True)
class RateOptions:
    """The rate limit of one task, checked when the task is defined."""

    key: KeyTemplate
    rate: str
    using: str
    #: ``"retry"`` or ``"fail"`` when the lock server cannot be reached.
    on_unavailable: str

    @classmethod
    def build(
        cls,
        rate: object,
        key: object,
        func: Callable[..., Any],
        *,
        using: str,
        on_unavailable: str,
    ) -> RateOptions:
        """Check ``rate`` and ``key`` (a template checked against ``func``)."""
        try:
            checked = str(parse_rate(rate))
        except ValueError as error:
            raise ValueError(f"lock_{error}") from None
        return cls(check_template(key, func), checked, using, on_unavailable)


def name_template(task_name: str) -> str:
    """A key template that is ``task_name`` itself (braces escaped): one limit per task."""
    return task_name.replace("{", "{{").replace("}", "}}")


def pass_rate_limit(
    options: RateOptions,
    task: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    app: Celery,
) -> None:
    """Return when this run of ``task`` may go on; else re-queue it (raise Retry) or fail it."""
    name = build_key(options.key, task.run, args, kwargs)
    request = task.request_stack.top
    in_worker = (
        request is not None
        and not request.called_directly
        and not getattr(request, "is_eager", False)
    )
    if in_worker and _reserved_for(request) == [name, request.retries]:
        logger.info(
            "rate limit %s of %r: the permit reserved for this run is due", options.rate, name
        )
        return
    try:
        limiter = get_rate_limiter(app, options.using, name, options.rate)
        if isinstance(limiter, AliasRateLimiter):
            limiter.key_template = template_label(options.key)  # the metrics' label
        if not in_worker:
            limiter.acquire()  # a direct or eager call waits for its permit here
            return
        max_retries = task.max_retries
        may_retry = max_retries is None or request.retries < max_retries
        reserved = limiter.reserve(1, within=None if may_retry else 0)
    except LockUnavailableError as error:
        if not in_worker or options.on_unavailable == "fail":
            logger.warning("%s: failing", error)
            raise
        countdown = unavailable_countdown(task)
        logger.warning("%s: retrying in %.3fs", error, countdown)
        raise task.retry(exc=error, countdown=countdown) from error
    if reserved.granted and reserved.wait <= 0:
        return
    over = RateLimitExceeded(
        f"rate limit {options.rate} of {name!r} reached: the next permit is due in "
        f"{reserved.wait:.3f}s",
        name=name,
        retry_after=reserved.wait,
    )
    if not reserved.granted:
        logger.info("%s, and no retry is left: failing", over)
        # retry() raises `over` itself: max_retries is used up.
        raise task.retry(exc=over, countdown=reserved.wait)
    logger.info(
        "rate limit %s of %r reached: retrying in %.3fs, when its permit is due",
        options.rate,
        name,
        reserved.wait,
    )
    headers = {RESERVED_HEADER: [name, request.retries + 1]}
    raise task.retry(exc=over, countdown=reserved.wait, headers=headers)


def _reserved_for(request: Any) -> list[Any] | None:
    """The run's :data:`RESERVED_HEADER`, as a list (None when it has none)."""
    value = getattr(request, RESERVED_HEADER, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(RESERVED_HEADER)
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    return list(value)
