"""What a view answers instead of a 500 when its lock gives up: 409, 503 or 400 (429: a rate limit).

``@locked`` and :class:`~django_rlock.middleware.LockErrorMiddleware` both
answer with these. No body or header names the lock or the server: lock
names may carry ids the client should not see.

A lock that gives up *after* the view's work (lost before its release, or a
release that cannot reach the server) never turns that work into an error:
the view's own response goes out with :data:`RELEASE_HEADER` saying what
became of the lock (:func:`mark_release`). Only when the work is undone (a
transaction rolled back, :func:`rolled_back_response`) or cut short (a lock
lost inside the view, :func:`lost_response`) is the answer a 503.
"""

from __future__ import annotations

import logging
import math
from typing import Final

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase

from django_rlock.core.exceptions import (
    DeadlockError,
    InvalidLockNameError,
    LockTimeout,
    LockUnavailableError,
)

logger = logging.getLogger("django_rlock.lock")

#: The Retry-After (seconds) of a view whose lock server is unreachable: an
#: outage has no known end, and a few seconds spreads the clients' retries.
#: Also that of a view whose lock was lost (a force-release, an outage past
#: the watchdog timeout): whoever holds the lock now is not known here.
UNAVAILABLE_RETRY_AFTER: Final = 5

#: The response header that tells a client its view's lock was not released
#: cleanly: ``lost`` (the hold expired or was taken over before the view
#: ended) or ``failed`` (the release did not reach the lock server; the lock
#: expires by itself). Its values never name the lock.
RELEASE_HEADER: Final = "X-Lock-Release"

#: :data:`RELEASE_HEADER`'s value when the hold was lost before its release.
LOST: Final = "lost"
#: :data:`RELEASE_HEADER`'s value when the release did not reach the server.
FAILED: Final = "failed"


def busy_status_response(error: LockTimeout | DeadlockError, status: int) -> HttpResponse:
    """What a view answers when its lock stayed busy and BUSY_RESPONSE is a status.

    ``status`` (409 by default) with a Retry-After taken from ``error``. The
    body does not name the lock: lock names may carry ids the client should
    not see. (Not itself a BUSY_RESPONSE callable, which takes ``(request, error)``.)
    A :class:`DeadlockError` (the view's wait was the victim of a deadlock) is
    answered the same way: to the client, the resource was busy.
    """
    retry_after = error.retry_after
    seconds = 1 if retry_after is None or not math.isfinite(retry_after) else retry_after
    response = HttpResponse(
        "This resource is busy with another request; retry later.\n",
        status=status,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(max(1, math.ceil(seconds)))
    return response


def rate_limited_response(wait: float, request: HttpRequest | None = None) -> HttpResponse:
    """What a ``@rate_limited`` view answers over its limit: 429 and an honest Retry-After.

    ``wait`` is the seconds until its permit is due, from the limiter's own
    script; Retry-After is that in whole seconds, rounded up, at least 1. The
    body names neither the limit nor its key (a key may carry a user's id).
    It is JSON (``{"detail": ..., "retry_after": N}``) when ``request`` asks
    for JSON (:func:`wants_json`), else plain text.
    """
    seconds = max(1, math.ceil(wait if math.isfinite(wait) else UNAVAILABLE_RETRY_AFTER))
    detail = "Too many requests; retry later."
    if request is not None and wants_json(request):
        response: HttpResponse = JsonResponse(
            {"detail": detail, "retry_after": seconds}, status=429
        )
    else:
        response = HttpResponse(f"{detail}\n", status=429, content_type="text/plain; charset=utf-8")
    response["Retry-After"] = str(seconds)
    return response


def wants_json(request: HttpRequest) -> bool:
    """Whether ``request``'s Accept header prefers JSON to text (an API client, ``fetch()``).

    JSON (``application/json`` or any ``+json`` type) must be named, with a
    quality at least that of any ``text/*`` type named: a browser's
    ``text/html,...,*/*`` gets text, a client sending only ``*/*`` too.
    """
    best_json = best_text = 0.0
    for part in request.headers.get("Accept", "").split(","):
        media, *params = (piece.strip() for piece in part.split(";"))
        quality = 1.0
        for param in params:
            label, _, value = param.partition("=")
            if label.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.lower()
        if media == "application/json" or media.endswith("+json"):
            best_json = max(best_json, quality)
        elif media.startswith("text/"):
            best_text = max(best_text, quality)
    return best_json > 0 and best_json >= best_text


def unavailable_response(error: LockUnavailableError) -> HttpResponse:
    """What a view answers when its lock server cannot be reached: 503 and Retry-After.

    From ``@locked``: the lock was not taken and the view did not run. From
    the middleware: a ``with rlock(...)`` in the view could not take its lock
    (or could not give it back, at the block's end: what the block did was
    done). The error (naming the alias) goes to the log; the body names
    neither the lock nor the server.
    """
    logger.error("%s", error)
    response = HttpResponse(
        "The service is temporarily unavailable; retry later.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    return response


def invalid_name_response(error: InvalidLockNameError) -> HttpResponse:
    """What a view answers when the lock name it built breaks a naming rule: 400.

    Such a name comes from the request (a URL slug with a control character
    in it), so it is the client's mistake, not a server error. The rule
    broken is logged (on ``django_rlock.lock``, at WARNING); the body names
    neither the lock nor the rule, since the name may carry data the client
    should not see echoed.
    """
    logger.warning("refused a request whose lock name is invalid: %s", error)
    return HttpResponse(
        "Bad request: this address cannot name a resource.\n",
        status=400,
        content_type="text/plain; charset=utf-8",
    )


def mark_release(response: object, outcome: str) -> None:
    """Tell the client, on ``response``, that its view's lock release ended ``outcome``.

    ``outcome`` is :data:`LOST` or :data:`FAILED`; several locks' outcomes
    are listed in :data:`RELEASE_HEADER`, comma-separated. Something that is
    not an HTTP response (a function view's caller may get anything) is left
    as it is.
    """
    if not isinstance(response, HttpResponseBase):
        return
    earlier = response.headers.get(RELEASE_HEADER)
    response.headers[RELEASE_HEADER] = outcome if not earlier else f"{earlier}, {outcome}"


def rolled_back_response() -> HttpResponse:
    """What a locked view answers when its lock was lost before its transaction committed.

    The view's changes were rolled back (``transaction="auto"``: committing
    them would have published work done without the lock held to the end),
    so nothing the view did in the database happened: 503, ``Retry-After``,
    and ``X-Lock-Release: lost``. The body names neither the lock nor the server.
    """
    response = HttpResponse(
        "The request was not completed: its lock was lost before its changes were "
        "committed, so they were rolled back; retry later.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    response[RELEASE_HEADER] = LOST
    return response


def lost_response() -> HttpResponse:
    """What a view answers when a lock it held in ``with rlock(...)`` was lost (the middleware).

    The error ended the view at the block's end: what the block did was done,
    unless a transaction around it rolled it back (``ATOMIC_REQUESTS``), and
    the rest of the view did not run. So the answer claims neither: 503,
    ``Retry-After``, ``X-Lock-Release: lost``. The body names neither the
    lock nor the server.
    """
    response = HttpResponse(
        "The request was interrupted: a lock it held was lost before it ended; retry later.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )
    response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    response[RELEASE_HEADER] = LOST
    return response
