# The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
RUNYARD := $(VENV)/bin/runyard
STAMP := $(VENV)/.runyard-installed

.PHONY: install up down demo test test-slurm-24.11 lint typecheck bench

$(STAMP): pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) bash scripts/bootstrap.sh
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(RUNYARD) dev up

down:
	$(RUNYARD) dev down

# A real training run on 2 nodes of the local Slurm cluster that survives an injected failure.
demo: up
	$(RUNYARD) dev demo

# Our code is byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (as on CI's
# machines) every process would compile it again, about 1 s of CPU at each rank's,
# agent's and CLI's start. Both tiers print their slowest 30 tests, so the next split
# uses measured times.
PYTEST := $(VENV)/bin/pytest -ra --durations=30

# The quick check: every unit test, and one real-Slurm, real-Postgres test of each whole
# path (marked whole_path: submit and cancel, an Xid onto a spare, fast recovery, ...).
# The unit tests run in two processes (pytest-xdist; each its own test database): alone,
# one pytest process kept a core idle while a test waited on its subprocesses (274 s in one
# process, 171 s in two, 2026-12-06). The whole paths share the dev cluster's nodes, so they
# run after, in one process. (Both tiers side by side took as long in all, 1171 s against
# ~1180 s on 2026-12-06: the whole paths' ranks compute too.)
test: up
	$(VENV)/bin/python -m compileall -q -j 0 contract worker service client planner sim tests migrations
	$(PYTEST) -n 2 -m "not integration and not heavy" tests/unit
	$(PYTEST) -m whole_path tests/integration

# Everything, as CI runs it: every integration test on the real Postgres and Slurm.
# The unit tests run in two processes as in `make test`; the heavy ones (timings that need
# the machine to themselves) and the integration tests (one dev cluster) in one, after.
test-all: up
	$(VENV)/bin/python -m compileall -q -j 0 contract worker service client planner sim tests migrations
	$(PYTEST) -n 2 -m "not integration and not heavy" tests/unit
	$(PYTEST) -m "integration or heavy"

# The whole paths marked every_slurm (their Slurm calls differ between versions) on Slurm
# 24.11 (Debian 13's 24.11.5, built into $(SLURM_2411) by scripts/build_slurm.sh: about 5
# minutes once, cached after) on a dev cluster of its own (.runyard/dev-slurm-24.11,
# topology/block, ports 1000 above), beside or without the default 22.05 one; then the
# block-topology test, which runs only there.
SLURM_2411 ?= /opt/slurm-24.11
ON_2411 := RUNYARD_DEV_SLURM=$(SLURM_2411) PATH=$(SLURM_2411)/bin:$(SLURM_2411)/sbin:$$PATH
test-slurm-24.11: $(STAMP)
	bash scripts/build_slurm.sh $(SLURM_2411)
	$(VENV)/bin/python -m compileall -q -j 0 contract worker service client planner sim tests migrations
	$(ON_2411) $(VENV)/bin/pytest -ra -m every_slurm
	$(ON_2411) $(VENV)/bin/pytest -ra tests/integration/test_block_topology.py

# lint-imports: the contracts in pyproject.toml (directions, no cycles, service's layers);
# scripts/import_graph.py: no import cycle anywhere, bench/ included (it lists any it finds).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python scripts/import_graph.py
	$(VENV)/bin/python scripts/longest_functions.py --max 80 service worker client runyard-client

# With the tests' fakes and shared fixtures (the fake Slurm itself is in service/slurm/).
typecheck: $(STAMP)
	$(VENV)/bin/mypy service client tests/fixtures tests/conftest.py \
	  tests/integration/conftest.py tests/unit/reconcile/conftest.py tests/unit/test_slurm_fake.py

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(VENV)/bin/python $$b || exit 1; done
