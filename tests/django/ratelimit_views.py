"""Views under ``@rate_limited`` and their URLs (``@pytest.mark.urls`` of test_ratelimits.py)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_rlock import rate_limited

#: How many times each view body ran, by view and key (the tests read it).
RAN: dict[str, int] = {}


def _ran(what: str) -> HttpResponse:
    RAN[what] = RAN.get(what, 0) + 1
    return HttpResponse(what)


@rate_limited("login:{username}", "2/m")
def login(request: HttpRequest, username: str) -> HttpResponse:
    return _ran(f"login {username}")


@rate_limited("poll:{username}", "2/s", burst=1)
def poll(request: HttpRequest, username: str) -> HttpResponse:
    return _ran(f"poll {username}")


@rate_limited("search:{username}", "2/m", using="mem")
async def search(request: HttpRequest, username: str) -> HttpResponse:
    return _ran(f"search {username}")


@method_decorator(rate_limited("export:{pk}", "1/h"), name="get")
class ExportView(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _ran(f"export {pk}")


@rate_limited("report:{username}", "1/m")
def build_report(username: str) -> str:
    """Not a view: over its limit it raises RateLimitExceeded."""
    return f"report {username}"


def report(request: HttpRequest, username: str) -> HttpResponse:
    """A view calling a rate-limited helper (LockErrorMiddleware answers its refusal)."""
    return _ran(build_report(username))


urlpatterns = [
    path("login/<str:username>/", login),
    path("poll/<str:username>/", poll),
    path("search/<str:username>/", search),
    path("export/<int:pk>/", ExportView.as_view()),
    path("report/<str:username>/", report),
]


# -- key=, method=, block=False, and the limited view (issue 34) -----------------------


def _keyed(kind: str) -> HttpResponse:
    return _ran(f"keyed {kind}")


@rate_limited("k-ip", "1/m", key="ip")
def keyed_ip(request: HttpRequest) -> HttpResponse:
    return _keyed("ip")


@rate_limited("k-user", "1/m", key="user")
def keyed_user(request: HttpRequest) -> HttpResponse:
    return _keyed("user")


@rate_limited("k-user-or-ip", "1/m", key="user_or_ip")
def keyed_user_or_ip(request: HttpRequest) -> HttpResponse:
    return _keyed("user_or_ip")


@rate_limited("k-header", "1/m", key="header:X-Api-Key")
def keyed_header(request: HttpRequest) -> HttpResponse:
    return _keyed("header")


@rate_limited("k-post", "1/m", key="post:username", method="POST")
def keyed_post(request: HttpRequest) -> HttpResponse:
    return _keyed(request.method or "")


@rate_limited("k-get", "1/m", key="get:q", method=["GET", "HEAD"])
def keyed_get(request: HttpRequest) -> HttpResponse:
    return _keyed("get")


def tenant_of(request: HttpRequest) -> str | None:
    """A callable key: the tenant the request names (None: it names none, a 400)."""
    return request.GET.get("tenant")


@rate_limited("k-callable", "1/m", key=tenant_of)
def keyed_callable(request: HttpRequest) -> HttpResponse:
    return _keyed("callable")


@rate_limited("k-async-user", "1/m", key="user")
async def keyed_async_user(request: HttpRequest) -> HttpResponse:
    return _keyed("async user")


@rate_limited("soft", "1/m", key="ip", block=False)
def soft(request: HttpRequest) -> HttpResponse:
    return _ran(f"soft limited={request.limited}")  # type: ignore[attr-defined]


@rate_limited("soft-async", "1/m", key="ip", block=False)
async def soft_async(request: HttpRequest) -> HttpResponse:
    return _ran(f"soft-async limited={request.limited}")  # type: ignore[attr-defined]


@rate_limited("form-login:{request.POST[username]}", "1/m", method="POST")
def form_login(request: HttpRequest) -> HttpResponse:
    """The template way of keying on a form field (it worked before key= existed)."""
    return _ran(f"form-login {request.POST['username']}")


def slow_down(request: HttpRequest, error: Exception) -> HttpResponse:
    """RLOCK_RATE_LIMITED_VIEW of a test: the project's own 'over the limit' page."""
    return HttpResponse(f"slow down ({type(error).__name__})", status=429)


urlpatterns += [
    path("k/ip/", keyed_ip),
    path("k/user/", keyed_user),
    path("k/user-or-ip/", keyed_user_or_ip),
    path("k/header/", keyed_header),
    path("k/post/", keyed_post),
    path("k/get/", keyed_get),
    path("k/callable/", keyed_callable),
    path("k/async-user/", keyed_async_user),
    path("soft/", soft),
    path("soft-async/", soft_async),
    path("form-login/", form_login),
]
