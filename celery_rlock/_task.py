"""LockedTask: a Celery Task base whose runs hold a distributed lock.

::

    @app.task(base=LockedTask, lock="report:{customer_id}", on_busy="skip")
    def build_report(customer_id): ...

    class Sync(LockedTask):          # or as a class, options as attributes
        lock = "sync:{account}"
        lock_timeout = 10
        on_busy = "wait"

        def run(self, account): ...

The options are read once, when the task is bound to its app, and checked
there: a bad template or option fails at import, i.e. at worker start. So
does an option LockedTask does not have (``lok_timeout=3``), with the close
match: an attribute that is neither Celery's nor LockedTask's and is named in
LockedTask's namespaces (``lock_*``, ``once_*``) or like one of its options.

A task revoked (or expired) before it ran frees its ``once`` marker.

``once="queued"`` pairs with an ``on_busy`` that runs the follow-up later
(``"retry"``, the default, or ``"wait"``): a follow-up that is skipped or
raises because the run it follows still holds the lock drops the change it
was queued for.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar, Final, Literal, get_args

from celery import Task
from celery._state import _task_stack
from celery.signals import task_revoked
from celery.utils import uuid
from celery.utils.log import get_task_logger

from celery_rlock._conf import get_lock
from celery_rlock._guard import (
    DEFAULT_ON_BUSY,
    DEFAULT_ON_LOST,
    DEFAULT_ON_UNAVAILABLE,
    OnBusy,
    OnLost,
    OnUnavailable,
    TaskLockOptions,
    run_locked,
)
from celery_rlock._once import AlreadyQueued, OnceMarker
from celery_rlock._ratelimit import RateOptions, name_template, pass_rate_limit
from celery_rlock._worker import install
from django_rlock._celeryface import KeyTemplate, build_key
from django_rlock.core._faces import check_lease
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS
from django_rlock.core.exceptions import LockUnavailableError

#: Default ``once_lease``: the longest a ``once`` marker outlives its task's
#: queue time or run (one hour, like celery-once's default).
DEFAULT_ONCE_LEASE: Final = 3600.0

OnDuplicate = Literal["raise", "return"]

logger = get_task_logger("celery_rlock")


class LockedTask(Task):  # type: ignore[misc]  # Celery ships no type hints: Task is Any
    """A Task base that runs each call under a watchdog-renewed distributed lock.

    Options (class attributes, or keywords of ``@app.task``):

    ``lock``
        Key template formatted with the run's signature-bound arguments
        (``"order:{order_id}"``), or a callable taking the task's arguments and
        returning the name. None: no lock (a plain task).
    ``lock_timeout``
        Seconds a run waits for a busy lock before ``on_busy`` applies (default
        None: ``"wait"`` waits as long as it takes, the others do not wait).
    ``lock_lease``
        Fixed expiry in seconds; None (default) keeps the lock alive through the
        watchdog for as long as the run lasts.
    ``lock_using``
        Lock alias (``RLOCKS`` key under Django; only ``"default"`` otherwise).
    ``lock_permits``
        None (default): the run holds the lock. N: the run holds one permit of
        the semaphore ``lock`` of N permits instead, so at most N runs with
        that key run at once across every worker (``on_busy`` applies when no
        permit is free). Not with ``once``.
    ``on_busy``
        ``"retry"`` (default), ``"skip"``, ``"wait"`` or ``"raise"``.
    ``on_lost``
        What a run whose lock turns out lost at its end does: ``"report"``
        (default: log it, ``self.request.rlock.lost`` turns true, Django's
        ``lock_lost`` signal; the body's result or exception stands) or
        ``"fail"`` (a body that succeeded fails with LockLostError).
    ``lock_max_hold``
        Seconds a run's hold may last: past it the watchdog stops renewing it
        and it is declared lost (default None: no bound).
    ``lock_done_ttl``
        Seconds a finished run's task id is remembered, so that a redelivery
        of the same message is dropped, not run again (default None: the
        broker's ``visibility_timeout`` plus a margin).
    ``on_unavailable``
        ``"retry"`` (default: re-queue, with Celery's back-off options and
        ``max_retries``) or ``"fail"`` when the lock server cannot be reached.
    ``once``
        True: ``apply_async`` refuses an equal task (same name and lock key)
        while one is queued or running. ``"queued"``: only while one is
        queued (sent and not yet holding its lock): a running one lets one
        follow-up be queued, so a change made during a run gets exactly one
        more run, and a task may enqueue itself from its body (see
        :mod:`celery_rlock._once`). ``once_lease`` (seconds, default one
        hour) bounds how long a marker can outlive a lost message;
        ``once_on_duplicate`` is ``"raise"`` (:class:`AlreadyQueued`, default)
        or ``"return"`` (the queued task's AsyncResult).
    ``lock_rate``
        A global rate limit, ``"N/s"``, ``"N/m"``, ``"N/h"`` or ``"N/d"``
        (default None: none): runs per period across every worker, per
        ``lock_rate_key``, with bursts of up to N after idling. A run over the
        limit is re-queued with the exact countdown until its permit is due,
        within ``max_retries`` (see :mod:`celery_rlock._ratelimit`). Works with
        or without ``lock``.
    ``lock_rate_key``
        The key template of the limit (default: the ``lock`` template, else
        the task's name: one limit for the task).

    While a run holds its lock, ``self.request.rlock`` is its
    :class:`~celery_rlock._guard.TaskLock` (name, fencing token, wait time,
    ``lost``).
    """

    abstract = True

    lock: KeyTemplate | None = None
    lock_timeout: float | None = None
    lock_lease: float | None = None
    lock_using: str = DEFAULT_LOCK_ALIAS
    lock_permits: int | None = None
    on_busy: OnBusy = DEFAULT_ON_BUSY
    on_lost: OnLost = DEFAULT_ON_LOST
    lock_max_hold: float | None = None
    lock_done_ttl: float | None = None
    on_unavailable: OnUnavailable = DEFAULT_ON_UNAVAILABLE
    once: bool | Literal["queued"] = False
    once_lease: float = DEFAULT_ONCE_LEASE
    once_on_duplicate: OnDuplicate = "raise"
    lock_rate: str | None = None
    lock_rate_key: KeyTemplate | None = None

    #: The checked options, built by on_bound; None when ``lock`` is None.
    #: Immutable and per task class, so sharing it between runs is safe.
    lock_options: ClassVar[TaskLockOptions | None] = None
    #: The checked rate limit, built by on_bound; None when ``lock_rate`` is None.
    rate_options: ClassVar[RateOptions | None] = None

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Check the lock options once the task has a name, a run and an app."""
        super().on_bound(app)
        cls._refuse_unknown_options()
        once = cls.once
        if not (isinstance(once, bool) or once == "queued"):
            raise ValueError(f"{cls.name}: once must be True, False or 'queued', got {once!r}")
        # Read through the class: a callable template stored as a class
        # attribute must not turn into a bound method.
        template = cls.__dict__.get("lock", cls.lock)
        template = getattr(template, "__func__", template)
        cls.rate_options = cls._rate_options(template)
        if template is None:
            if once:
                raise ValueError(f"{cls.name}: once={once!r} needs a lock key template (lock=...)")
            cls.lock_options = None
            return
        cls.lock_options = TaskLockOptions.build(
            template,
            cls.run,
            timeout=cls.lock_timeout,
            lease=cls.lock_lease,
            using=cls.lock_using,
            on_busy=cls.on_busy,
            on_lost=cls.on_lost,
            permits=cls.lock_permits,
            max_hold=cls.lock_max_hold,
            done_ttl=cls.lock_done_ttl,
            on_unavailable=cls.on_unavailable,
        )
        if once and cls.lock_permits is not None:
            raise ValueError(
                f"{cls.name}: once={once!r} refuses an equal queued task, lock_permits lets "
                "several run at once: use one or the other"
            )
        if once:
            check_lease(cls.once_lease)
            if cls.once_on_duplicate not in get_args(OnDuplicate):
                raise ValueError(
                    f"{cls.name}: once_on_duplicate must be one of {get_args(OnDuplicate)}, "
                    f"got {cls.once_on_duplicate!r}"
                )
        install(app)

    @classmethod
    def _refuse_unknown_options(cls) -> None:
        """Refuse an attribute that looks like a misspelt option (``lok_timeout``).

        Celery makes each keyword of ``@app.task`` a class attribute, so a typo
        would otherwise be kept and ignored: the task would run with the
        default. Only names LockedTask owns or nearly matches are refused; the
        subclass's own methods and other attributes stay free.
        """
        for klass in cls.__mro__:
            if klass is LockedTask:
                break
            for name, value in vars(klass).items():
                if name.startswith("_") or name in _CELERY_AND_OURS or _is_a_def(name, value):
                    continue
                close = _close_option(name)
                if close or name.startswith(_OUR_PREFIXES):
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(
                        f"{cls.name}: {name!r} is not a LockedTask option{hint}; the options "
                        f"are {', '.join(sorted(OPTIONS))} (and Celery's own task options)"
                    )

    @classmethod
    def _rate_options(cls, lock_template: KeyTemplate | None) -> RateOptions | None:
        """The checked ``lock_rate`` options (None: no rate limit)."""
        key = cls.__dict__.get("lock_rate_key", cls.lock_rate_key)
        key = getattr(key, "__func__", key)
        if cls.lock_rate is None:
            if key is not None:
                raise ValueError(f"{cls.name}: lock_rate_key needs a lock_rate (e.g. '100/m')")
            return None
        if key is None:
            key = lock_template if lock_template is not None else name_template(cls.name)
        if not isinstance(cls.lock_using, str) or not cls.lock_using:
            raise ValueError(
                f"lock_using must be a lock alias (a non-empty str), got {cls.lock_using!r}"
            )
        return RateOptions.build(
            cls.lock_rate, key, cls.run, using=cls.lock_using, on_unavailable=cls.on_unavailable
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task body within its rate limit, holding its lock (released however it ends)."""
        if self.lock_options is None and self.rate_options is None:
            return super().__call__(*args, **kwargs)
        top = self.request_stack.top
        if top is not None and not top.called_directly:
            # A worker (or eager) run: the tracer pushed this run's request.
            return self._run_guarded(args, kwargs)
        # Called directly, ``task(...)``: push a request of its own first, as
        # Task.__call__ does, so the run's state has a per-call home.
        _task_stack.push(self)
        self.push_request(args=args, kwargs=kwargs)
        try:
            return self._run_guarded(args, kwargs)
        finally:
            self.pop_request()
            _task_stack.pop()

    def _run_guarded(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Pass the rate limit, if any, then run the body under the lock, if any."""
        rate = self.rate_options
        if rate is not None:
            pass_rate_limit(rate, self, args, kwargs, app=self._get_app())
        options = self.lock_options
        if options is None:
            return self.run(*args, **kwargs)
        return self._run_locked(options, args, kwargs)

    def _run_locked(
        self, options: TaskLockOptions, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        return run_locked(
            options,
            self.run,
            args,
            kwargs,
            app=self._get_app(),
            task=self,
            body=lambda: self.run(*args, **kwargs),
            once_lease=self.once_lease if self.once else None,
            once_queued=self.once == "queued",
        )

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        *posargs: Any,
        **options: Any,
    ) -> Any:
        """Send the task; with ``once``, refuse a duplicate of a queued (or running) one."""
        if not self.once or self.lock_options is None:
            return super().apply_async(args, kwargs, task_id, *posargs, **options)
        if self.once == "queued" and self._is_own_retry(task_id):
            # The running message going on (self.retry(), on_busy="retry"), not
            # a new enqueue: never refused. The run's end moves the marker.
            return super().apply_async(args, kwargs, task_id, *posargs, **options)
        task_id = task_id or uuid()
        marker = self.once_marker(tuple(args or ()), dict(kwargs or {}))
        existing = marker.claim(task_id)
        if existing is not None:
            if self.once_on_duplicate == "return":
                return self.AsyncResult(existing)
            state = "queued" if self.once == "queued" else "queued or running"
            raise AlreadyQueued(
                f"{self.name}: an equal task ({existing}) is already {state} "
                f"under lock {marker.lock.name!r}",
                name=marker.lock.name,
                task_id=existing,
            )
        try:
            return super().apply_async(args, kwargs, task_id, *posargs, **options)
        except BaseException:
            marker.done(task_id)
            raise

    def _is_own_retry(self, task_id: str | None) -> bool:
        """Whether sending ``task_id`` re-sends the message this process is running."""
        request = self.request_stack.top
        return (
            task_id is not None
            and request is not None
            and not request.called_directly
            and request.id == task_id
        )

    def once_marker(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OnceMarker:
        """The ``once`` marker of a call with these arguments."""
        options = self.lock_options
        if options is None:
            raise ValueError(
                f"{self.name}: once={self.once!r} needs a lock key template (lock=...)"
            )
        name = build_key(options.key, self.run, args, kwargs)
        lock = get_lock(self._get_app(), options.using, name, lease=options.lease)
        return OnceMarker(lock, self.name, self.once_lease, queued_only=self.once == "queued")


#: LockedTask's options: its annotated attributes but the ``ClassVar`` results of the checks.
OPTIONS: Final = frozenset(
    name
    for name, hint in LockedTask.__annotations__.items()
    if not str(hint).startswith(("ClassVar", "typing.ClassVar"))
)

#: Every attribute of Celery's Task and of LockedTask: options, methods, state.
_CELERY_AND_OURS: Final = frozenset(dir(LockedTask))

#: Names LockedTask keeps for its options: an unknown one there is a typo.
_OUR_PREFIXES: Final = ("lock_", "once_")


def _close_option(name: str) -> list[str]:
    """The option ``name`` is a likely misspelling of: close, and with the same first letter.

    The first letter keeps a subclass's own ``block`` or ``clock`` from reading
    as a misspelt ``lock``.
    """
    close = difflib.get_close_matches(name, sorted(OPTIONS), n=1, cutoff=0.8)
    return [option for option in close if option[0] == name[0]]


def _is_a_def(name: str, value: object) -> bool:
    """Whether ``value`` is what a ``def name`` (or a decorated one) in a class body makes."""
    if isinstance(value, staticmethod | classmethod | property):
        return True
    return callable(value) and getattr(value, "__name__", None) == name


def _on_task_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
    # Sent in the worker's main process when it drops a revoked or expired
    # task (before or while it runs). An equal task may be queued again now; a
    # run that was terminated also lets its lock expire within the watchdog timeout.
    if not isinstance(sender, LockedTask) or not sender.once or request is None:
        return
    try:
        sender.once_marker(tuple(request.args or ()), dict(request.kwargs or {})).done(request.id)
    except LockUnavailableError as error:
        logger.warning("%s: it expires within once_lease (%gs)", error, sender.once_lease)


task_revoked.connect(_on_task_revoked, weak=False)
