"""The shop's Celery app, wired the standard way: Django settings, tasks of every app.

Run a worker with ``celery -A shop worker --pool=prefork --concurrency=2``. Its
tasks take their locks from ``RLOCKS`` (django_rlock's ``locks``), like the views.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop")
# Every CELERY_* Django setting configures the app (CELERY_BROKER_URL -> broker_url).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
