"""The Django settings of the test suite: no database, the app, and test URLs.

RLOCKS points at the real redis-server of the tests through the ``rlocks``
fixture in tests/django/conftest.py; the value here is never connected to.
"""

SECRET_KEY = "django-rlock-tests"
DEBUG = True
USE_TZ = True
INSTALLED_APPS = ["django_rlock"]
DATABASES: dict[str, dict[str, str]] = {}
ROOT_URLCONF = "tests.django.urls"
MIDDLEWARE: list[str] = []
ALLOWED_HOSTS = ["testserver"]
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
RLOCKS = {"default": {"LOCATION": "redis://127.0.0.1:1/0"}}
