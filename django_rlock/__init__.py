"""django-rlock: Redisson-grade distributed locks for Django and Celery, on Redis."""

__version__ = "0.1.0"
