"""Django settings of the Django-configured Celery worker (tests/celery/test_config.py).

The lock server is the test Redis, named by the environment the worker gets;
``KEY_PREFIX`` differs from the Celery-only tests' so a test can tell which
configuration a lock came from.
"""

import os

SECRET_KEY = "django-rlock-celery-tests"
USE_TZ = True
INSTALLED_APPS = ["django_rlock"]
DATABASES: dict[str, dict[str, str]] = {}
RLOCKS = {
    "default": {
        "LOCATION": os.environ.get("RLOCK_TEST_BROKER_URL", "redis://127.0.0.1:1/0"),
        "KEY_PREFIX": "djtest",
        "WATCHDOG_TIMEOUT": 1,
    }
}
# "prometheus" when a test asks for metrics (tests/celery/test_metrics.py).
RLOCK_METRICS = os.environ.get("RLOCK_TEST_METRICS")
