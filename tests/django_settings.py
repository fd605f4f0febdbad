"""The Django settings of the test suite: the app, the admin, and test URLs.

RLOCKS points at the real redis-server of the tests through the ``rlocks``
fixture in tests/django/conftest.py; the value here is never connected to.
The admin and its apps are installed for the admin page's browser test
(tests/django/test_admin.py); only tests marked for the database use it.
"""

SECRET_KEY = "django-rlock-tests"
DEBUG = True
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_rlock",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
ROOT_URLCONF = "tests.django.urls"
# The URLconf's views take locks without LockErrorMiddleware on purpose (they test the
# 500 answers and the run-time hint): W020 would be printed by every management command
# a test runs. tests/django/test_missing_pieces.py checks W020 itself (run_checks()
# reports silenced checks too).
SILENCED_SYSTEM_CHECKS = ["django_rlock.W020"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
RLOCKS = {"default": {"LOCATION": "redis://127.0.0.1:1/0"}}
