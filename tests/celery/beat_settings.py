"""Django settings of the Django-configured beats (tests/celery/test_beat.py).

The beats wrap django-celery-beat's DatabaseScheduler on a SQLite file the
test makes, and take their lock from ``RLOCKS["default"]`` (no ``rlock_url``).
"""

import os

SECRET_KEY = "django-rlock-beat-tests"
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_celery_beat"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("RLOCK_BEAT_DB", ":memory:"),
        "OPTIONS": {"timeout": 20},
    }
}
RLOCKS = {
    "default": {
        "LOCATION": os.environ.get("RLOCK_BEAT_REDIS_URL", "redis://127.0.0.1:1/2"),
        "KEY_PREFIX": "btest",
        "WATCHDOG_TIMEOUT": float(os.environ.get("RLOCK_BEAT_WATCHDOG", "1.5")),
    }
}
