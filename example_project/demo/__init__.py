"""``make demo``: the example shop under load, on real processes, checked step by step.

``python -m demo`` (from ``example_project/``) migrates a fresh SQLite database,
starts the embedded Redis (or uses ``REDIS_URL``), a Celery worker (prefork, 2
processes) and the Django development server on a free port, then drives them
with concurrent HTTP requests and tasks for about a minute. On the way it
SIGKILLs a worker process that holds a report lock and pauses a lock holder
past its lease. It prints a progress line, then a table of checks, stops
everything it started (also on Ctrl-C) and exits non-zero if a check failed.
"""
