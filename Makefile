# The README's two commands are `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
RUNYARD := $(VENV)/bin/runyard
STAMP := $(VENV)/.runyard-installed

.PHONY: install up down demo test lint typecheck bench

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

# The whole suite, integration tests included, on the real Postgres and the real Slurm.
# Our code is byte-compiled first: where PYTHONDONTWRITEBYTECODE is set (as on CI's
# machines) every process would compile it again, about 1 s of CPU at each rank's,
# agent's and CLI's start.
test: up
	$(VENV)/bin/python -m compileall -q -j 0 contract worker service client planner sim tests migrations
	$(VENV)/bin/pytest -ra

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy service client

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(VENV)/bin/python $$b || exit 1; done
