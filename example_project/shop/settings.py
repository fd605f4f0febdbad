"""Settings of the example shop: SQLite for orders, Redis for locks and the Celery broker.

Environment:

``REDIS_URL``
    The Redis of the locks and of the Celery broker and results
    (``redis://host:6379/0``, ``rediss://``, ``unix:///path.sock``). Unset: an
    embedded redis-server (see :mod:`shop.embedded_redis`), over a unix socket.
``SHOP_DATA_DIR``
    Where the SQLite database (and the embedded Redis) live; default ``var/``.
``SHOP_NAMESPACE``
    Lock key prefix and Celery queue, so several shops can share one Redis.
``SHOP_WATCHDOG_TIMEOUT``
    ``RLOCK_WATCHDOG_TIMEOUT`` in seconds (default 30; the demo uses 2).
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("SHOP_DATA_DIR", BASE_DIR / "var"))
DATA_DIR.mkdir(parents=True, exist_ok=True)
NAMESPACE = os.environ.get("SHOP_NAMESPACE", "shop")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-shop-not-a-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django_rlock",  # system checks and the `manage.py rlock` command
    "orders",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    # A busy `with rlock()` in a view answers 409 + Retry-After, as @locked does
    # (without it, the LockTimeout would be a 500).
    "django_rlock.middleware.LockErrorMiddleware",
]
ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "shop.sqlite3",
        "OPTIONS": {
            # Web threads and worker processes write at once: wait for the
            # database's write lock (BEGIN IMMEDIATE) instead of failing
            # (transaction_mode and init_command: Django 5.1+).
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
        # Tests run against a file too: a live server's threads share it.
        "TEST": {"NAME": str(DATA_DIR / "test-shop.sqlite3")},
    }
}

# -- locks --------------------------------------------------------------------------------

# How long a lock outlives its holder's last sign of life. While a holder runs,
# its process renews the lock every third of this; a holder that dies (a
# SIGKILLed worker) leaves the lock for at most this long.
RLOCK_WATCHDOG_TIMEOUT = float(os.environ.get("SHOP_WATCHDOG_TIMEOUT", "30"))

REDIS_URL = os.environ.get("REDIS_URL")
if REDIS_URL:
    RLOCKS = {
        "default": {
            "BACKEND": "django_rlock.backends.redis.RedisLockBackend",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": NAMESPACE,
        }
    }
    CELERY_BROKER_URL = REDIS_URL
else:
    from shop.embedded_redis import broker_url

    EMBEDDED_REDIS = DATA_DIR / "redis.rdb"
    RLOCKS = {
        "default": {
            "BACKEND": "django_rlock.backends.embedded.EmbeddedRedisLockBackend",
            "LOCATION": str(EMBEDDED_REDIS),
            "KEY_PREFIX": NAMESPACE,
        }
    }
    CELERY_BROKER_URL = broker_url(EMBEDDED_REDIS)

# -- Celery (read by shop/celery.py through namespace="CELERY") ---------------------------

CELERY_RESULT_BACKEND = CELERY_BROKER_URL
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_DEFAULT_QUEUE = NAMESPACE
# A worker process takes one message at a time: a long report must not sit on
# messages another process could run.
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# -- the shop -------------------------------------------------------------------------------

#: Seconds the (simulated) payment provider takes to answer a charge.
SHOP_PAYMENT_LATENCY = 0.03

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django_rlock": {"handlers": ["console"], "level": "WARNING"},
        "orders": {"handlers": ["console"], "level": "INFO"},
    },
}
