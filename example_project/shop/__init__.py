"""The example shop: a Django project whose views and Celery tasks share django-rlock locks."""

# Load the Celery app when Django starts, so @shared_task and autodiscovery
# bind to it (the standard Django + Celery layout).
from shop.celery import app as celery_app

__all__ = ["celery_app"]
