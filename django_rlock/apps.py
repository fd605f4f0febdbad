"""The Django app: add ``"django_rlock"`` to INSTALLED_APPS for checks and the command."""

from __future__ import annotations

from django.apps import AppConfig


class DjangoRlockConfig(AppConfig):
    """Registers the system checks and the settings-change receiver."""

    name = "django_rlock"
    verbose_name = "Distributed locks"

    def ready(self) -> None:
        """Register the checks, the ``locks`` handler's receiver, and Celery's task-run hooks."""
        import sys  # noqa: PLC0415

        from django_rlock import _checks, _handler  # noqa: F401, PLC0415 -- imported to register

        if "celery" in sys.modules:
            # A Celery worker (or a project with a Celery app): its task runs
            # end their holds, whether or not celery_rlock is imported.
            from django_rlock._scopes import taskruns  # noqa: PLC0415 -- only where Celery is

            taskruns.wire_task_runs()
