"""The old home of the cache lock's errors, kept so that results stored before it moved load.

The cache lock lives in :mod:`django_rlock.backends._cachelock`. A Celery result
of a failed task stores its exception by module path: pickled (the ``pickle``
result serializer) as ``django_rlock._cache_lock.CacheLockTimeout``, or, in
JSON, as ``exc_module``/``exc_type``. Without this module a result stored by
an older version (and a worker still running one, during a rolling upgrade)
would no longer load as the error it was. Nothing else imports it but
:mod:`django_rlock.cache`: Celery's JSON reader finds the module only among
those already imported. Kept for as long as such results may be stored.
"""

from __future__ import annotations

from django_rlock.backends._cachelock import (
    CacheLock,
    CacheLockLostError,
    CacheLockNotOwnedError,
    CacheLockTimeout,
)
