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
