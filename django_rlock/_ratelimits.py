"""``@rate_limited``: a global rate limit per key for Django views (and any function).

::

    from django_rlock import rate_limited

    @rate_limited("login:{username}", "5/m")          # 5 at once, then one every 12 s
    def login(request, username): ...

    @rate_limited("search:{request.user.pk}", "30/m", burst=5)
    async def search(request): ...                    # async views too

    @method_decorator(rate_limited("export:{pk}", "1/h"), name="get")
    class ExportView(View): ...                       # class-based views

The key is built as ``@locked`` builds its lock name (the template
``str.format``-ed with the call's bound arguments, or a callable taking them),
and every process on the alias shares its limit: the rate limiter of
:meth:`LockClient.rate_limiter <django_rlock.core.LockClient.rate_limiter>`
(GCRA on the server's clock; see docs/rate-limits.md).

A call within the limit runs. Over it, a view (a function whose first
argument, or second after ``self``, is an ``HttpRequest``) answers ``429 Too
Many Requests`` with ``Retry-After``: the seconds until its permit is due,
rounded up to a whole second, at least 1. Nothing is taken from the limit by
a refused call, so a client that waits as told gets in. Anything that is not
a view raises :class:`~django_rlock.exceptions.RateLimitExceeded`, a
``LockTimeout`` (``retry_after``: the exact seconds), which
``LockErrorMiddleware`` answers 429 as well when it reaches a view. A lock
server that cannot be reached answers 503 with ``Retry-After: 5`` (the view
does not run), as ``@locked`` does; a name the request makes invalid answers
400. For Celery tasks, use ``LockedTask``'s ``lock_rate``, which re-queues the
task until its permit is due.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.http import HttpResponse

from django_rlock._decorators import _request_of, _signature_source
from django_rlock._handler import locks
from django_rlock._keys import KeyTemplate, build_key, check_template, template_label
from django_rlock._responses import (
    invalid_name_response,
    rate_limited_response,
    unavailable_response,
)
from django_rlock.core._protocol.ratelimit import Reservation, check_burst, parse_rate
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS
from django_rlock.core.exceptions import (
    InvalidLockNameError,
    LockUnavailableError,
    RateLimitExceeded,
)

F = TypeVar("F", bound=Callable[..., Any])


def rate_limited(
    template: KeyTemplate,
    rate: str,
    *,
    burst: int | None = None,
    using: str = DEFAULT_LOCK_ALIAS,
) -> Callable[[F], F]:
    """Let the decorated function run at most ``rate`` times per period for each key.

    ``template`` names the limit from the call's arguments (as ``@locked``'s
    key template), ``rate`` is ``"N/s"``, ``"N/m"``, ``"N/h"`` or ``"N/d"``,
    ``burst`` (default N) how many calls may run at once after idling,
    ``using`` the RLOCKS alias. Over the limit a view answers 429 with
    Retry-After; see the module. Bad arguments raise ValueError when decorating.
    """
    checked_burst = check_burst(burst, parse_rate(rate))
    if not isinstance(using, str):
        raise ValueError(f"using must be a lock alias (a str), not {type(using).__name__}")

    def decorator(func: F) -> F:
        source = _signature_source(func)
        key = check_template(template, source)
        label = template_label(key)

        def held_back(args: tuple[Any, ...], name: str, reserved: Reservation) -> HttpResponse:
            """A view's 429; anything else raises RateLimitExceeded (a LockTimeout)."""
            if _request_of(args) is None:
                raise RateLimitExceeded(
                    f"rate limit {rate} (burst {checked_burst}) of {name!r} reached: the next "
                    f"permit is due in {reserved.wait:.3f}s",
                    name=name,
                    retry_after=reserved.wait,
                )
            return rate_limited_response(reserved.wait)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                try:
                    name = build_key(key, source, args, kwargs)
                    limiter = locks[using].async_rate_limiter(name, rate, checked_burst)
                except InvalidLockNameError as error:
                    return _refuse_name(args, error)
                limiter.key_template = label
                try:
                    reserved = await limiter.reserve(1, within=0)
                except LockUnavailableError as error:
                    return _unreachable(args, error)
                if not reserved.granted:
                    return held_back(args, name, reserved)
                return await func(*args, **kwargs)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                name = build_key(key, source, args, kwargs)
                limiter = locks[using].rate_limiter(name, rate, checked_burst)
            except InvalidLockNameError as error:
                return _refuse_name(args, error)
            limiter.key_template = label
            try:
                reserved = limiter.reserve(1, within=0)
            except LockUnavailableError as error:
                return _unreachable(args, error)
            if not reserved.granted:
                return held_back(args, name, reserved)
            return func(*args, **kwargs)

        return cast(F, wrapper)

    return decorator


def _refuse_name(args: tuple[Any, ...], error: InvalidLockNameError) -> HttpResponse:
    """A view whose key, built from the request, breaks a naming rule: 400; else raise."""
    if _request_of(args) is None:
        raise error
    return invalid_name_response(error)


def _unreachable(args: tuple[Any, ...], error: LockUnavailableError) -> HttpResponse:
    """A view whose lock server cannot be reached: 503 (logged); else raise."""
    if _request_of(args) is None:
        raise error
    return unavailable_response(error)
