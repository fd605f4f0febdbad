"""The admin's page of live locks: ``admin:django_rlock_lock_changelist``.

One read-only list per ``RLOCKS`` alias of the locks held now (name, holders,
TTL, fencing token, waiters), searchable by name, read from the backends (SCAN,
never KEYS). Staff need the ``django_rlock.view_lock`` permission to see it.
Only superusers may force-release a lock, after a confirmation page, by a POST
that Django's CSRF protection guards; each force-release is written to the
admin's log (a LogEntry naming the alias and the lock) and to the
``django_rlock.admin`` logger. The holder learns of it as a lost lock.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from django_rlock._handler import locks
from django_rlock.backends.base import LockInfo
from django_rlock.core.exceptions import LockError
from django_rlock.exceptions import LockSettingError
from django_rlock.models import Lock

logger = logging.getLogger("django_rlock.admin")

if TYPE_CHECKING:
    _LockModelAdmin = admin.ModelAdmin[Lock]  # generic in django-stubs only
else:
    _LockModelAdmin = admin.ModelAdmin

#: Locks listed per alias at most: SCAN stops there, and the page says so.
MAX_LISTED = 500


@dataclass(frozen=True)
class _Row:
    alias: str
    info: LockInfo

    @property
    def ttl(self) -> str:
        ttl = self.info.ttl
        if ttl is None:
            return "-"
        return "no expiry" if math.isinf(ttl) else f"{ttl:.1f}s"

    @property
    def holder(self) -> str:
        return self.info.holder_text()

    @property
    def held_for(self) -> str:
        seconds = self.info.held_for()
        return "-" if seconds is None else f"{seconds:.1f}s"


@dataclass
class _AliasListing:
    alias: str
    rows: list[_Row] = field(default_factory=list)
    error: str | None = None
    truncated: bool = False


def _glob_literal(text: str) -> str:
    """``text`` matched literally inside a glob pattern (fnmatch and Redis MATCH)."""
    return "".join(f"[{char}]" if char in "*?[]" else char for char in text)


@admin.register(Lock)
class LockAdmin(_LockModelAdmin):
    """Live locks per alias, read from the lock servers; force-release for superusers."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Never: locks are taken by code, not created here."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Lock | None = None) -> bool:
        """Never: a lock has nothing to edit."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Lock | None = None) -> bool:
        """Never through delete: force-release is its own view, for superusers."""
        return False

    def get_urls(self) -> list[URLPattern]:
        """Only the list and the force-release confirmation: there is nothing to add or edit."""
        info = self.opts.app_label, self.opts.model_name
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path(
                "force-release/",
                view(self.force_release_view),
                name="{}_{}_force_release".format(*info),
            ),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Every alias's live locks, filtered by the search box (a substring of the name)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        query = request.GET.get("q", "").strip()
        listings = [self._listing(alias, query) for alias in _aliases()]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Locks held now",
            "query": query,
            "listings": listings,
            "can_force_release": _is_superuser(request),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_rlock/lock/change_list.html", context)

    def _listing(self, alias: str, query: str) -> _AliasListing:
        listing = _AliasListing(alias)
        pattern = f"*{_glob_literal(query)}*" if query else "*"
        try:
            backend = locks[alias]
            for name in backend.names(pattern):
                if len(listing.rows) >= MAX_LISTED:
                    listing.truncated = True
                    break
                info = backend.inspect(name)
                if info is not None:  # released between the scan and the look
                    listing.rows.append(_Row(alias, info))
        except (LockError, LockSettingError) as error:
            listing.error = str(error)
        listing.rows.sort(key=lambda row: row.info.name)
        return listing

    def force_release_view(self, request: HttpRequest) -> HttpResponse:
        """Ask to confirm (GET), then force-release (POST); superusers only."""
        if not _is_superuser(request):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        alias, name = source.get("alias", ""), source.get("name", "")
        if alias not in _aliases() or not name:
            messages.error(request, "No such lock alias or lock name.")
            return HttpResponseRedirect(self._changelist_url())
        if request.method != "POST":
            info = locks[alias].inspect(name)
            context = {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "title": "Force-release a lock?",
                "alias": alias,
                "name": name,
                "info": info,
                "held_for": None if info is None else _Row(alias, info).held_for,
            }
            return TemplateResponse(
                request, "admin/django_rlock/lock/force_release_confirmation.html", context
            )
        released = locks[alias].force_release(name)
        self._log_force_release(request, alias, name, released=released)
        if released:
            messages.success(request, f"Lock {name!r} ({alias}) was force-released.")
        else:
            messages.warning(request, f"Lock {name!r} ({alias}) was not held any more.")
        return HttpResponseRedirect(self._changelist_url())

    def _log_force_release(
        self, request: HttpRequest, alias: str, name: str, *, released: bool
    ) -> None:
        outcome = "force-released" if released else "force-release found it free"
        LogEntry.objects.create(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(Lock, for_concrete_model=False).pk,
            object_id=f"{alias}:{name}",
            object_repr=f"{alias}:{name}"[:200],
            action_flag=DELETION,
            change_message=f"Lock {name!r} of alias {alias!r}: {outcome}.",
        )
        logger.warning(
            "lock %r (alias %r) %s by admin user %r",
            name,
            alias,
            outcome,
            request.user.get_username(),
        )

    def _changelist_url(self) -> str:
        return reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")


def _is_superuser(request: HttpRequest) -> bool:
    # A custom user model may lack is_superuser (AbstractBaseUser): then nobody is.
    user = request.user
    return bool(user.is_active and getattr(user, "is_superuser", False))


def _aliases() -> list[str]:
    configured = getattr(settings, "RLOCKS", None)
    return list(configured) if isinstance(configured, dict) else ["default"]
