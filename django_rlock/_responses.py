"""What a view answers instead of a 500 when its lock gives up: 409, 503 or 400 (429: a rate limit).

``@locked`` and :class:`~django_rlock.middleware.LockErrorMiddleware` both
answer with these. No body names the lock or the server: lock names may
carry ids the client should not see.
"""

from __future__ import annotations

import logging
import math
from typing import Final

from django.http import HttpResponse

from django_rlock.core.exceptions import InvalidLockNameError, LockTimeout, LockUnavailableError

logger = logging.getLogger("django_rlock.lock")

#: The Retry-After (seconds) of a view whose lock server is unreachable: an
#: outage has no known end, and a few seconds spreads the clients' retries.
UNAVAILABLE_RETRY_AFTER: Final = 5


def busy_status_response(error: LockTimeout, status: int) -> HttpResponse:
    """What a view answers when its lock stayed busy and BUSY_RESPONSE is a status.

    ``status`` (409 by default) with a Retry-After taken from ``error``. The
    body does not name the lock: lock names may carry ids the client should
    not see. (Not itself a BUSY_RESPONSE callable, which takes ``(request, error)``.)
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


def rate_limited_response(wait: float) -> HttpResponse:
    """What a ``@rate_limited`` view answers over its limit: 429 and an honest Retry-After.

    ``wait`` is the seconds until its permit is due, from the limiter's own
    script; Retry-After is that in whole seconds, rounded up, at least 1. The
    body names neither the limit nor its key (a key may carry a user's id).
    """
    response = HttpResponse(
        "Too many requests; retry later.\n",
        status=429,
        content_type="text/plain; charset=utf-8",
    )
    seconds = wait if math.isfinite(wait) else float(UNAVAILABLE_RETRY_AFTER)
    response["Retry-After"] = str(max(1, math.ceil(seconds)))
    return response


def unavailable_response(error: LockUnavailableError) -> HttpResponse:
    """What a view answers when its lock server cannot be reached: 503 and Retry-After.

    The lock was not taken and the view did not run. The error (naming the
    alias) goes to the log; the body names neither the lock nor the server.
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
