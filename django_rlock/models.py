"""The admin's handle on live locks: a model with no table.

Django's admin lists the objects of a model, and its URL names, permissions
and LogEntry rows all hang on one. Locks live in Redis, not in the database, so
:class:`Lock` is unmanaged (``managed = False``: no table is ever created or
queried); :mod:`django_rlock.admin` reads the locks from the backends instead.
"""

from __future__ import annotations

from django.db import models


class Lock(models.Model):
    """A lock held now, as the admin shows it (never stored)."""

    #: ``<alias>:<lock name>``: what a LogEntry of a force-release names.
    key: models.CharField[str, str] = models.CharField(max_length=1024, primary_key=True)

    class Meta:
        """Unmanaged: no table; only the view permission."""

        managed = False
        verbose_name = "lock"
        verbose_name_plural = "locks"
        # Only "view": force-release is for superusers, never a grantable permission.
        default_permissions = ("view",)

    def __str__(self) -> str:
        return str(self.key)
