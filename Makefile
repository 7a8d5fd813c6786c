# rl-export task runner. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help prereqs install browser run test unit integration lint typecheck format schemas clean bench bench-ab bench-ceiling bench-export bench-web profile soak bench-restart

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

prereqs: ## check Python >= 3.11, Java >= 17 and Maven, with a clear message
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "rl-export needs Python >= 3.11, found " + sys.version.split()[0])'
	@command -v java >/dev/null || { echo "rl-export needs Java >= 17 for the local Kafka broker: java not found" >&2; exit 1; }
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	  [ "$${v:-0}" -ge 17 ] || { echo "rl-export needs Java >= 17 for the local Kafka broker, found $$v" >&2; exit 1; }
	@command -v mvn >/dev/null || { echo "rl-export needs Maven to fetch Kafka from Maven Central: mvn not found" >&2; exit 1; }

$(STAMP): pyproject.toml
	@$(MAKE) --no-print-directory prereqs
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) browser ## create .venv and install rl-export with the dev tools (idempotent)

# The page's end-to-end tests drive Debian's chromium (Playwright never downloads a browser
# here). Installed with apt-get when missing and we are root (CI is); otherwise the browser
# tests are skipped, with one line in pytest's summary that says so.
browser: ## Debian's chromium for the browser tests (apt-get install when missing, as root)
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium with apt-get for the browser tests ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
	    || { echo "make: apt-get could not install chromium" >&2; exit 1; }; \
	else \
	  echo "NOTE: chromium is missing and cannot be installed here (needs root and apt-get): the browser tests will be skipped" >&2; \
	fi

run: install ## start the embedded stack (Kafka, every stage, synthetic traffic); data in var/
	$(BIN)/rl-export dev

lint: install ## ruff lint and format check
	$(BIN)/ruff check services tests examples
	$(BIN)/ruff format --check services tests examples

typecheck: install ## mypy --strict
	$(BIN)/mypy

format: install ## apply ruff's formatting and safe fixes
	$(BIN)/ruff format services tests examples
	$(BIN)/ruff check --fix services tests examples

schemas: install ## regenerate schemas/ from the pydantic models
	$(BIN)/python -m rl_export.common.schemas schemas

unit: install ## the fast unit tests only
	$(BIN)/python -m pytest -m "not integration" $(PYTEST_ARGS)

integration: install ## the integration tests (real Kafka broker and SeaweedFS)
	$(BIN)/python -m pytest -m integration $(PYTEST_ARGS)

# pytest exits 5 when it collected no tests: for us that is a failure, not a pass.
test: lint typecheck ## the whole suite: lint, types, unit and integration tests
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean: ## remove the virtualenv, caches and var/ (the Kafka jars in .cache/ are kept)
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache .hypothesis

bench: install ## benchmarks: the worker (vs a bare consumer, 100k events), bench-export, bench-web
	$(BIN)/python -m rl_export.local.bench
	$(BIN)/python -m rl_export.local.bench_export
	$(BIN)/python -m rl_export.local.bench_web

bench-ab: install ## one worker with other settings against the defaults, on one backlog: AB="join_processes=1" (SHAPE=small)
	$(BIN)/python -m rl_export.local.bench_ab --variant "" --variant "$(AB)" $(if $(SHAPE),--shape $(SHAPE))

bench-ceiling: install ## one worker against the same worker with its join replayed (its own work free): what a faster join could give (SHAPE=small)
	$(BIN)/python -m rl_export.local.ceiling $(if $(SHAPE),--shape $(SHAPE))

bench-export: install ## export benchmark: 1,000,000 records (built once, cached in var/bench/)
	$(BIN)/python -m rl_export.local.bench_export

bench-web: install ## web benchmark: index catch-up and query latency on 1,000,000 records, label to visible
	$(BIN)/python -m rl_export.local.bench_web

profile: install ## the join and the sink in process: CPU µs per event, per traffic shape
	$(BIN)/python -m rl_export.local.profile --shape standard --traces 24000
	$(BIN)/python -m rl_export.local.profile --shape small --traces 24000

soak: install ## fault soak: 2 workers, 10 min of load, 24 SIGKILLs, broker restart, store outages, a pause (SEED=n)
	$(BIN)/python -m rl_export.local.soak $(if $(SEED),--seed $(SEED))

bench-restart: install ## restart-to-ready and first commits of a worker on 1,000,000 traces (built once in var/)
	$(BIN)/python -m rl_export.local.bench_restart
