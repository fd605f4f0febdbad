"""``@rate_limited``: a global rate limit per key for Django views (and any function).

::

    from django_rlock import rate_limited

    @rate_limited("login", "5/m", key="post:username", method="POST")
    def login(request): ...                            # 5 tries per user name, then one every 12 s

    @rate_limited("signup", "10/h", key="ip")
    def signup(request): ...                           # per client address

    @rate_limited("search", "30/m", key="user_or_ip", block=False)
    async def search(request):                         # the view decides: request.limited
        ...

    @rate_limited("login:{username}", "5/m")          # the name from the URL's arguments
    def login_page(request, username): ...

    @method_decorator(rate_limited("export:{pk}", "1/h"), name="get")
    class ExportView(View): ...                       # class-based views

The limit's name is built as ``@locked`` builds its lock name (the template
``str.format``-ed with the call's bound arguments, or a callable taking
them); ``key`` adds what the request says (django-ratelimit's vocabulary):

===================  ========================================  =====================
``key``              the limit is per                          name (``"login"``)
===================  ========================================  =====================
``"ip"``             client address (``REMOTE_ADDR``; IPv6:    ``login:ip=203.0.113.7``
                     its /64, which one client holds)
``"user"``           signed-in user (its pk)                   ``login:user=42``
``"user_or_ip"``     user when signed in, else address         either of the above
``"header:<name>"``  request header's value                    ``login:header:x-api-key=…``
``"post:<field>"``   form field's value                        ``login:post:username=ann``
``"get:<field>"``    query parameter's value                   ``login:get:q=…``
a callable           ``key(request) -> str``                   ``login:<what it returns>``
===================  ========================================  =====================

A request that lacks what its key names (a POST without the field, no
signed-in user for ``"user"``, a callable returning None, a template field
``{request.POST[username]}`` that is missing) is the client's error: ``400``
saying what is missing, and the view does not run. ``method`` (a method or a
list) limits only those methods; the others pass untouched.

Every process on the alias shares a limit: the rate limiter of
:meth:`LockClient.rate_limiter <django_rlock.core.LockClient.rate_limiter>`
(GCRA on the server's clock; see docs/rate-limits.md). A call within the
limit runs. Over it, a view answers ``429 Too Many Requests`` with
``Retry-After`` (the seconds until its permit is due, rounded up, at least
1), as JSON when the request asks for JSON; the setting
``RLOCK_RATE_LIMITED_VIEW`` (a dotted path to a view ``(request,
RateLimitExceeded) -> HttpResponse``) answers instead. With ``block=False``
the view runs either way, with ``request.limited`` True when over the limit.
A refused call takes no permit; it keeps the polite callers' place, so a
client that waits as told gets in (docs/rate-limits.md, "Fairness").
Anything that is not a view raises
:class:`~django_rlock.exceptions.RateLimitExceeded`, a ``LockTimeout``
(``retry_after``: the exact seconds), which ``LockErrorMiddleware`` answers
429 as well when it reaches a view. A lock server that cannot be reached
answers 503 with ``Retry-After: 5`` (the view does not run), as ``@locked``
does; a name the request makes invalid answers 400. For Celery tasks, use
``LockedTask``'s ``lock_rate``, which re-queues the task until its permit is due.
"""

from __future__ import annotations

import functools
import inspect
import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase

from django_rlock._conf import imported_callable
from django_rlock._handler import locks
from django_rlock._keys import KeyTemplate, build_key, check_template, template_label
from django_rlock._web.decorators import _request_of, _signature_source
from django_rlock._web.responses import (
    invalid_name_response,
    rate_limited_response,
    unavailable_response,
    wants_json,
)
from django_rlock.core._faces import Reservation, check_burst, fit_name, parse_rate
from django_rlock.core.defaults import DEFAULT_LOCK_ALIAS
from django_rlock.core.exceptions import (
    InvalidLockNameError,
    LockUnavailableError,
    RateLimitExceeded,
)
from django_rlock.exceptions import LockSettingError

logger = logging.getLogger("django_rlock.lock")

F = TypeVar("F", bound=Callable[..., Any])

#: A ``key``: one of :data:`KEY_KINDS` (``"post:<field>"`` and the like with their
#: argument), or a callable ``(request) -> str``.
RequestKey = str | Callable[[HttpRequest], "str | None"]

#: The key kinds taken alone, and those taking ``:<name>``.
KEY_KINDS = ("ip", "user", "user_or_ip")
KEY_FIELDS = ("header", "post", "get")

#: The setting naming the view that answers a request over its limit.
LIMITED_VIEW_SETTING = "RLOCK_RATE_LIMITED_VIEW"


class MissingKey(InvalidLockNameError):
    """The request lacks what its limit is keyed on; ``str()`` tells the client what.

    An :class:`InvalidLockNameError` (no name can be built from the request):
    were it to escape a view, ``LockErrorMiddleware`` would answer 400 too.
    """


@dataclass(frozen=True, slots=True)
class KeyRule:
    """A checked ``key``: how to read a request's part of the limit's name.

    ``needs_user``: reads ``request.user`` (an async view awaits ``auser()``
    first, as Django's lazy user may not be read in an event loop).
    """

    label: str
    read: Callable[[HttpRequest, Any], str]
    needs_user: bool = False


def rate_limited(
    name: KeyTemplate,
    rate: str,
    *,
    key: RequestKey | None = None,
    method: str | Iterable[str] | None = None,
    block: bool = True,
    burst: int | None = None,
    using: str = DEFAULT_LOCK_ALIAS,
) -> Callable[[F], F]:
    """Let the decorated function run at most ``rate`` times per period for each key.

    ``name`` names the limit from the call's arguments (as ``@locked``'s key
    template), ``rate`` is ``"N/s"``, ``"N/m"``, ``"N/h"`` or ``"N/d"``;
    ``key`` adds the request's part (``"ip"``, ``"user"``, ``"user_or_ip"``,
    ``"header:<name>"``, ``"post:<field>"``, ``"get:<field>"`` or a callable
    ``(request) -> str``); ``method`` limits only those HTTP methods;
    ``block=False`` runs the view over the limit too, with
    ``request.limited`` True; ``burst`` (default N) is how many calls may run
    at once after idling; ``using`` the RLOCKS alias. Over the limit a view
    answers 429 with Retry-After; see the module. Bad arguments raise
    ValueError when decorating.
    """
    checked_burst = check_burst(burst, parse_rate(rate))
    rule = key_rule(key)
    methods = check_methods(method)
    if not isinstance(block, bool):
        raise ValueError(f"block must be True or False, not {block!r}")
    if not isinstance(using, str):
        raise ValueError(f"using must be a lock alias (a str), not {type(using).__name__}")

    def decorator(func: F) -> F:
        limit = _Limit(
            func, name, rate=rate, burst=checked_burst, rule=rule, methods=methods, block=block
        )

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                request = limit.request_of(args)
                if limit.passes(request):
                    return await func(*args, **kwargs)
                try:
                    user = await _auser(request) if limit.needs_user else None
                    named = limit.name(request, user, args, kwargs)
                    limiter = locks[using].async_rate_limiter(named, rate, checked_burst)
                    limiter.key_template = limit.label
                    reserved = await limiter.reserve(1, within=0, polite=True)
                except (MissingKey, InvalidLockNameError, LockUnavailableError) as error:
                    return limit.refused(request, error)
                answer = limit.answer(request, named, reserved)
                return await func(*args, **kwargs) if answer is None else answer

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            request = limit.request_of(args)
            if limit.passes(request):
                return func(*args, **kwargs)
            try:
                user = _user(request) if limit.needs_user else None
                named = limit.name(request, user, args, kwargs)
                limiter = locks[using].rate_limiter(named, rate, checked_burst)
                limiter.key_template = limit.label
                reserved = limiter.reserve(1, within=0, polite=True)
            except (MissingKey, InvalidLockNameError, LockUnavailableError) as error:
                return limit.refused(request, error)
            answer = limit.answer(request, named, reserved)
            return func(*args, **kwargs) if answer is None else answer

        return cast(F, wrapper)

    return decorator


class _Limit:
    """What one decorated function's calls share: how to name its limit and answer."""

    def __init__(
        self,
        func: Callable[..., Any],
        name: KeyTemplate,
        *,
        rate: str,
        burst: int,
        rule: KeyRule | None,
        methods: frozenset[str] | None,
        block: bool,
    ) -> None:
        self.func = func
        self.source = _signature_source(func)
        self.template = check_template(name, self.source)
        self.label = template_label(self.template)
        if rule is not None:
            self.label = f"{self.label}:{rule.label}"
        self.rate, self.burst, self.rule, self.methods, self.block = (
            rate,
            burst,
            rule,
            methods,
            block,
        )
        self.needs_user = rule is not None and rule.needs_user

    def request_of(self, args: tuple[Any, ...]) -> HttpRequest | None:
        """The call's request; a TypeError when key=, method= or block=False need one."""
        request = _request_of(args)
        if request is None and (
            self.rule is not None or self.methods is not None or not self.block
        ):
            raise TypeError(
                f"@rate_limited on {self.func.__qualname__} with key=, method= or block=False "
                "needs a view: its first argument (or second after self) must be the request"
            )
        return request

    def passes(self, request: HttpRequest | None) -> bool:
        """Whether the call's method is one the limit leaves alone."""
        return (
            request is not None and self.methods is not None and request.method not in self.methods
        )

    def name(
        self, request: HttpRequest | None, user: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> str:
        """The limit's name for this call: the template's, then the key's part."""
        try:
            built = build_key(self.template, self.source, args, kwargs)
        except InvalidLockNameError:
            raise
        except ValueError as error:
            # build_key raises `from None`, which keeps the cause in __context__: a
            # KeyError is an item the request lacks ({request.POST[username]}).
            if request is not None and isinstance(error.__context__, KeyError):
                raise MissingKey(
                    f"this request lacks a value the rate limit is keyed on, {error.__context__}"
                ) from error
            raise
        if self.rule is None or request is None:
            return built
        return fit_name(f"{built}:{self.rule.read(request, user)}")

    def answer(
        self, request: HttpRequest | None, name: str, reserved: Reservation
    ) -> HttpResponseBase | None:
        """None to run the function; else the answer over the limit (a non-view raises)."""
        if not self.block:
            _mark_limited(cast(HttpRequest, request), not reserved.granted)
            return None
        if reserved.granted:
            return None
        error = RateLimitExceeded(
            f"rate limit {self.rate} (burst {self.burst}) of {name!r} reached: the next "
            f"permit is due in {reserved.wait:.3f}s",
            name=name,
            retry_after=reserved.wait,
        )
        if request is None:
            raise error
        return limited_answer(request, error)

    def refused(
        self,
        request: HttpRequest | None,
        error: MissingKey | InvalidLockNameError | LockUnavailableError,
    ) -> HttpResponse:
        """The view's answer to ``error`` (400, 400, 503); a non-view raises it."""
        if request is None:
            raise error
        if isinstance(error, MissingKey):
            return missing_key_response(request, error)
        if isinstance(error, InvalidLockNameError):
            return invalid_name_response(error)
        return unavailable_response(error)


# -- keys ------------------------------------------------------------------------------


def key_rule(key: object) -> KeyRule | None:
    """``key`` checked: None, a kind of :data:`KEY_KINDS`, ``"<field kind>:<name>"``, a callable.

    Anything else is a ValueError listing what is accepted.
    """
    if key is None:
        return None
    if callable(key):
        return KeyRule(template_label(key), _called(key))
    if isinstance(key, str):
        if key == "ip":
            return KeyRule("ip", lambda request, user: f"ip={client_address(request)}")
        if key == "user":
            return KeyRule("user", lambda request, user: f"user={_user_pk(user)}", True)
        if key == "user_or_ip":
            return KeyRule("user_or_ip", _user_or_ip, True)
        kind, colon, field = key.partition(":")
        if colon and kind in KEY_FIELDS:
            if not field or field != field.strip():
                raise ValueError(
                    f"key {key!r} must name the {kind} field after '{kind}:', without spaces"
                )
            return KeyRule(key, _field_reader(kind, field))
    accepted = ", ".join([*map(repr, KEY_KINDS), *(f"'{kind}:<name>'" for kind in KEY_FIELDS)])
    raise ValueError(f"key must be one of {accepted} or a callable (request) -> str, got {key!r}")


def _called(key: Callable[[HttpRequest], str | None]) -> Callable[[HttpRequest, Any], str]:
    def read(request: HttpRequest, user: Any) -> str:
        value = key(request)
        if value is None:
            raise MissingKey("this request lacks what the rate limit is keyed on")
        if not isinstance(value, str):
            raise TypeError(f"rate limit key {key!r} returned {value!r}, not a str or None")
        return value

    return read


def _field_reader(kind: str, field: str) -> Callable[[HttpRequest, Any], str]:
    what = {"header": "header", "post": "form field", "get": "query parameter"}[kind]

    def read(request: HttpRequest, user: Any) -> str:
        source = {"header": request.headers, "post": request.POST, "get": request.GET}[kind]
        value = source.get(field)
        if value is None:
            raise MissingKey(f"this request needs the {what} {field!r}")
        return f"{kind}:{field.lower() if kind == 'header' else field}={value}"

    return read


def client_address(request: HttpRequest) -> str:
    """``REMOTE_ADDR``; for IPv6 its /64 (one client's network, which it may roam)."""
    address = request.META.get("REMOTE_ADDR") or ""
    try:
        parsed = ipaddress.ip_address(address)
    except ValueError:
        raise MissingKey("the client's address is not known") from None
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return str(parsed)


def _user(request: HttpRequest | None) -> Any:
    if request is None or not hasattr(request, "user"):
        raise TypeError(
            "key='user' and 'user_or_ip' read request.user: add "
            "django.contrib.auth.middleware.AuthenticationMiddleware to MIDDLEWARE"
        )
    return request.user


async def _auser(request: HttpRequest | None) -> Any:
    if request is not None and hasattr(request, "auser"):  # Django >= 5.0
        return await request.auser()
    return await sync_to_async(_user)(request)


def _user_pk(user: Any) -> str:
    if user is None or not user.is_authenticated:
        raise MissingKey("this request needs a signed-in user")
    return str(user.pk)


def _user_or_ip(request: HttpRequest, user: Any) -> str:
    if user is not None and user.is_authenticated:
        return f"user={user.pk}"
    return f"ip={client_address(request)}"


def check_methods(method: object) -> frozenset[str] | None:
    """``method`` as upper-case method names: a str, an iterable of str, or None (every method)."""
    if method is None:
        return None
    names = [method] if isinstance(method, str) else method
    if not isinstance(names, Iterable):
        raise ValueError(f"method must be a str, a list of str or None, not {method!r}")
    checked = []
    for name in names:
        if not isinstance(name, str) or not name.isalpha():
            raise ValueError(f"method must name HTTP methods such as 'POST', got {method!r}")
        checked.append(name.upper())
    if not checked:
        raise ValueError("method must name at least one HTTP method (None: every method)")
    return frozenset(checked)


# -- answers ---------------------------------------------------------------------------


def limited_view() -> Callable[[HttpRequest, RateLimitExceeded], HttpResponseBase] | None:
    """``RLOCK_RATE_LIMITED_VIEW``: None (the default 429), or a view's dotted path (or itself).

    The view is called as ``view(request, error)`` (``error.retry_after``: the
    exact seconds). A path that does not import is a :class:`LockSettingError`.
    """
    found = getattr(settings, LIMITED_VIEW_SETTING, None)
    if found is None or callable(found):
        return found
    if isinstance(found, str):
        view = imported_callable(found, LIMITED_VIEW_SETTING, "not an importable view")
        if view is not None:
            return cast(Callable[[HttpRequest, RateLimitExceeded], HttpResponseBase], view)
    raise LockSettingError(
        f"{LIMITED_VIEW_SETTING} must be None or the dotted path of a view "
        f"(request, RateLimitExceeded) -> HttpResponse, got {found!r}",
        check_id="django_rlock.E006",
    )


def limited_answer(request: HttpRequest, error: RateLimitExceeded) -> HttpResponseBase:
    """A view's answer over its limit: the 429, or ``RLOCK_RATE_LIMITED_VIEW``'s.

    The setting's view gets a Retry-After when it sets none.
    """
    wait = error.retry_after or 0.0
    view = limited_view()
    if view is None:
        return rate_limited_response(wait, request)
    response = view(request, error)
    if isinstance(response, HttpResponseBase) and "Retry-After" not in response:
        response["Retry-After"] = rate_limited_response(wait)["Retry-After"]
    return response


def missing_key_response(request: HttpRequest, missing: MissingKey) -> HttpResponse:
    """400: the request lacks what its limit is keyed on (said in the body; JSON if asked)."""
    logger.warning("refused a rate-limited request: %s", missing)
    detail = f"Bad request: {missing}."
    if wants_json(request):
        return JsonResponse({"detail": detail}, status=400)
    return HttpResponse(f"{detail}\n", status=400, content_type="text/plain; charset=utf-8")


def _mark_limited(request: HttpRequest, over: bool) -> None:
    """``request.limited``: True once any limit of the view's (block=False) was reached."""
    request.limited = getattr(request, "limited", False) or over  # type: ignore[attr-defined]
