"""The Django app: add ``"django_rlock"`` to INSTALLED_APPS for checks and the command."""

from __future__ import annotations

from django.apps import AppConfig


class DjangoRlockConfig(AppConfig):
    """Registers the system checks and the settings-change receiver."""

    name = "django_rlock"
    verbose_name = "Distributed locks"

    def ready(self) -> None:
        """Register the checks (by importing them) and the ``locks`` handler's receiver."""
        from django_rlock import _checks, _handler  # noqa: F401, PLC0415 -- imported to register
