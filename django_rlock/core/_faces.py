"""The engine's one door for its faces: what ``django_rlock`` and ``celery_rlock`` borrow.

The faces (the Django app and the Celery integration) take the engine's
public names from :mod:`django_rlock.core`, :mod:`django_rlock.core.aio`,
:mod:`~django_rlock.core.exceptions` and :mod:`~django_rlock.core.defaults`,
and everything else from here: no face module imports ``core._protocol``,
``core._sync``, ``core._aio`` or ``core._process`` directly
(``tests/test_structure.py`` asserts it). So a move inside the engine changes
an import line here, not dozens across the faces, and this file is the list of
what the engine lends its faces beyond the public contract.

Not a user's API: these names may change in any release. A flat list of
imports (re-exports only: ruff.toml and setup.cfg say so for this file),
grouped by what the faces do with them; a name sits in the first group that
uses it.
"""

# isort: split
# --- Kinds the Django face's alias handles build on ---------------------------------
# Engine classes that are not public kinds but that an alias handle subclasses or
# builds: the Redisson-layout twins, the read-write lock's keys and scripts (an
# alias builds its own sides), the semaphore base (a Celery delivery reads a
# permit's holder), and the options a handle passes through.
from django_rlock.core._aio.redisson import AsyncRedissonRLock
from django_rlock.core._protocol.lock import LockOptions
from django_rlock.core._protocol.rwlock import RWScripts
from django_rlock.core._protocol.semaphore import SemaphoreBase
from django_rlock.core._sync.redisson import RedissonRLock

# isort: split
# --- Argument checks ----------------------------------------------------------------
# The engine's own checks, so a bad setting, decorator argument or task option is
# refused as early as the face sees it, with the engine's message.
from django_rlock.core._process.lockorder import check_lock_order_check
from django_rlock.core._protocol.deadlocks import check_deadlock_timeout
from django_rlock.core._protocol.layouts import LAYOUTS, REDISSON, RLOCK, SHARDED_SUBSCRIPTION_MODES
from django_rlock.core._protocol.names import (
    check_key_prefix,
    check_lease,
    check_max_hold,
    check_name,
    check_timeout,
    check_watchdog_timeout,
)
from django_rlock.core._protocol.ratelimit import check_burst, parse_rate
from django_rlock.core._protocol.redisson import check_redisson_name
from django_rlock.core._protocol.semaphore import check_permits

# isort: split
# --- Keys and what Redis holds under them -------------------------------------------
# Reading a lock's state without taking it: the backends' inspect and list (the
# admin, ``manage.py rlock``), the wait-for graph, Retry-After, the Celery face's
# duplicate and beat bookkeeping, and names cut to fit a key.
from django_rlock.core._process.holder import (
    DESCRIPTION_FIELDS,
    SINCE_FIELD,
    is_holder_field,
    read_hold,
    read_holder,
    stored_task_id,
)
from django_rlock.core._protocol.deadlocks import MAX_CYCLE, Edge, edge_key, wait_name
from django_rlock.core._protocol.lock import TOKEN_FIELD
from django_rlock.core._protocol.names import LockKeys, escape, fit_name, milliseconds
from django_rlock.core._protocol.ratelimit import LimiterState, Reservation
from django_rlock.core._protocol.redisson import redisson_keys
from django_rlock.core._protocol.semaphore import permit_prefix
from django_rlock.core._sync.ratelimiter import read_limiter_state

# isort: split
# --- Connections --------------------------------------------------------------------
# The backends build the Redis client the engine runs on (URL schemes, options,
# redaction in messages) and report an unreachable server the engine's way.
from django_rlock.core._protocol.unavailable import UNREACHABLE, reported_unavailable
from django_rlock.core._protocol.urls import redact_url
from django_rlock.core._sync.connection import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    RedisClient,
    check_url,
    connection_options,
    derive_client,
    describe,
    from_url,
)

# isort: split
# --- The process: owners, holders, forks, units of work -----------------------------
# Owner ids and holder lines for messages, fork hooks for the face's per-process
# state, the unit of work a request or task run is (leaks), the lock order check.
from django_rlock.core._process import forking, leaks
from django_rlock.core._process.holder import busy_reason, holder_details, holder_line
from django_rlock.core._process.identity import thread_owner
from django_rlock.core._process.lockorder import lock_order

# isort: split
# --- What the observers watch -------------------------------------------------------
# The hold registry's events and the watchdog's renewals (metrics, signals,
# reporting), and the engine's clock (hold times measured as the engine measures).
from django_rlock.core._protocol import clock
from django_rlock.core._protocol.holds import GaveUp, Hold, HoldRegistry
from django_rlock.core._sync import watchdog
