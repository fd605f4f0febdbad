"""The Django face's one door for the Celery face: what ``celery_rlock`` borrows.

``celery_rlock`` builds on the Django face (the same ``locked`` decorator, key
templates, alias locks, Retry-After rule and reporting) and takes all of it
from here, beside the public names of :mod:`django_rlock`: no ``celery_rlock``
module imports another private module of the Django face
(``tests/test_structure.py`` asserts it). The engine's internals it needs come
through the engine's own door, :mod:`django_rlock.core._faces`.

Not a user's API: these names may change in any release. A flat list of
imports (re-exports only: ruff.toml and setup.cfg say so for this file),
grouped by what the Celery face does with them.
"""

# isort: split
# --- One ``locked`` for functions, views and tasks -------------------------------------
# celery_rlock registers its task runner with the Django face's decorator (the
# Django face never imports the Celery face) and builds lock names from a task's
# arguments with the same key templates.
from django_rlock._keys import KeyTemplate, build_key, check_template, template_label
from django_rlock._web.decorators import LockedSpec, register_task_runner

# isort: split
# --- What an alias hands out ----------------------------------------------------------
# To tell a lock or rate limiter of ``locks[alias]`` (reported, metered) from a bare
# engine one, and to report its outcomes as the Django face does.
from django_rlock._observers.reporting import reporter_of
from django_rlock.backends._ratelimiters import AliasRateLimiter
from django_rlock.backends._types import AliasAttached

# isort: split
# --- When to try again ----------------------------------------------------------------
# A busy task's retry countdown follows the rule a busy view's Retry-After does.
from django_rlock._observers.holdtimes import MIN_RETRY_AFTER
from django_rlock._observers.retryafter import lock_retry_after
from django_rlock._web.responses import UNAVAILABLE_RETRY_AFTER

# isort: split
# --- Task runs as units of work --------------------------------------------------------
# What a task run kept is given back when it ends (wired from either side).
from django_rlock._scopes.taskruns import wire_task_runs
