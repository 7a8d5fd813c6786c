# rl-export task runner. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The join's native core (native/: Rust, PyO3), built by maturin into the venv when its
# sources change; without cargo the join runs the Python rules (RL_EXPORT_JOIN_NATIVE=auto).
NATIVE_STAMP := $(VENV)/.installed-native
NATIVE_SOURCES := native/Cargo.toml native/Cargo.lock native/pyproject.toml \
	native/rl_export_native.pyi $(wildcard native/src/*.rs)
TRAINERS_STAMP := $(VENV)/.installed-trainers
ENGINES_STAMP := $(VENV)/.installed-engines
# Spark's readers of the open tables: Delta Lake and S3A jars (deploy/spark/pom.xml) copied
# from Maven Central with `mvn dependency:copy-dependencies` (not Spark's ivy, which cannot
# resolve them here): a version bump is a new path.
DELTA_SPARK_VERSION := 4.4.0
SPARK_JARS := .cache/spark-delta/$(DELTA_SPARK_VERSION)/jars
# The chat templates of the render matrix (trl installed without its dependencies).
TRL_VERSION := 1.16.0
PYTEST_ARGS ?=
# make test runs pytest in this many processes (pytest-xdist), a test file per process at a
# time: each process starts its own broker, store and web stack. 1 runs it in this process.
PYTEST_WORKERS ?= 2
XDIST = $(if $(filter-out 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)
# kustomize for the manifests' tests (tests/unit/test_kubernetes.py builds deploy/kubernetes/),
# installed from its Go module path into the project's .cache/: a version bump is a new path.
KUSTOMIZE_VERSION := v5.8.1
KUSTOMIZE := .cache/kustomize/$(KUSTOMIZE_VERSION)/kustomize
# promtool for the alert rules' tests (`promtool test rules`), taken from Debian's prometheus
# package and unpacked, not installed: installing it would start a Prometheus server.
PROMTOOL := .cache/promtool/promtool
# axe-core for the page's accessibility checks in the browser tests, fetched from npm with
# `npm pack` (no node_modules, no install scripts): a version bump is a new path.
AXE_VERSION := 4.14.1
AXE := .cache/axe-core/$(AXE_VERSION)/axe.min.js
# The peers of `make bench-peers`: Quix Streams (the `peers` dependency group of pyproject.toml)
# in a virtualenv of its own, as its releases pin pydantic and confluent-kafka below .venv's;
# the Kafka Streams peer is built with Maven by the bench itself, into .cache/peers/.
PEERS_VENV := .cache/peers/venv
PEERS_STAMP := $(PEERS_VENV)/.installed

.PHONY: help prereqs install native browser kustomize promtool axe run test test-trainers test-engines unit integration lint typecheck format schemas docs clean bench bench-ab bench-ceiling bench-export bench-web bench-agreement bench-redact bench-eos bench-isolation bench-tenants bench-peers profile soak bench-restart bench-scaling screenshots

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
	$(BIN)/pip install --quiet --no-deps "trl==$(TRL_VERSION)"
	@touch $(STAMP)

install: $(STAMP) native browser kustomize promtool axe ## create .venv and install rl-export with the dev tools (idempotent)

# cargo is on the developers' and CI's machines (rustup); pip builds the crate with maturin
# (fetched from PyPI into pip's build environment) and the crates from crates.io, pinned by
# native/Cargo.lock (--locked). About a minute, once per change of native/.
native: $(NATIVE_STAMP) ## the join's native core (Rust, native/) into the venv, when cargo is there

$(NATIVE_STAMP): $(STAMP) $(NATIVE_SOURCES)
	@if command -v cargo >/dev/null 2>&1; then \
	  echo "building the join's native core (native/, cargo and maturin) ..."; \
	  MATURIN_PEP517_ARGS="--locked" $(BIN)/pip install --quiet --force-reinstall --no-deps ./native \
	    || { echo "make: could not build the join's native core (native/)" >&2; exit 1; }; \
	  touch $(NATIVE_STAMP); \
	else \
	  echo "NOTE: cargo is missing: the join's native core is not built and the join runs its Python rules (the native core's tests are skipped)" >&2; \
	fi

# Go is on the developers' and CI's machines; without it the kustomize build tests are
# skipped, with one line in pytest's summary that says so.
kustomize: ## kustomize (go install, into .cache/) for the Kubernetes manifests' tests
	@if [ -x $(KUSTOMIZE) ]; then :; \
	elif command -v go >/dev/null 2>&1; then \
	  echo "installing kustomize $(KUSTOMIZE_VERSION) with go install (a few minutes, once) ..."; \
	  GOBIN="$(CURDIR)/$(dir $(KUSTOMIZE))" GOFLAGS=-buildvcs=false \
	    go install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION) \
	    || { echo "make: go install of kustomize failed" >&2; exit 1; }; \
	else \
	  echo "NOTE: go is missing: kustomize is not installed and the kustomize build tests will be skipped" >&2; \
	fi

promtool: ## promtool (Debian's prometheus package, unpacked into .cache/) for the alert rules' tests
	@if [ -x $(PROMTOOL) ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then \
	  echo "fetching promtool from Debian's prometheus package ..."; \
	  dir=$$(mktemp -d) && chmod 755 $$dir && cd $$dir && \
	  { apt-get download prometheus >/dev/null 2>&1 \
	    || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get download prometheus >/dev/null; }; } && \
	  dpkg-deb -x prometheus_*.deb unpacked && cd "$(CURDIR)" && mkdir -p $(dir $(PROMTOOL)) && \
	  cp $$dir/unpacked/usr/bin/promtool $(PROMTOOL); rc=$$?; rm -rf $$dir; \
	  [ $$rc = 0 ] || { echo "make: could not fetch promtool with apt-get download" >&2; exit 1; }; \
	else \
	  echo "NOTE: apt-get is missing: promtool is not fetched and the alert rules' promtool tests will be skipped" >&2; \
	fi

axe: ## axe-core (npm pack, into .cache/) for the page's accessibility checks in the browser tests
	@if [ -f $(AXE) ]; then :; \
	elif command -v npm >/dev/null 2>&1; then \
	  echo "fetching axe-core $(AXE_VERSION) with npm pack ..."; \
	  dir=$$(mktemp -d) && \
	  { npm pack --silent --pack-destination $$dir axe-core@$(AXE_VERSION) >/dev/null \
	    && tar -xzf $$dir/axe-core-$(AXE_VERSION).tgz -C $$dir package/axe.min.js \
	    && mkdir -p $(dir $(AXE)) && cp $$dir/package/axe.min.js $(AXE).partial \
	    && mv $(AXE).partial $(AXE); }; rc=$$?; rm -rf $$dir; \
	  [ $$rc = 0 ] || { echo "make: could not fetch axe-core with npm pack" >&2; exit 1; }; \
	else \
	  echo "NOTE: npm is missing: axe-core is not fetched and the page's accessibility checks will be skipped" >&2; \
	fi

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
	$(BIN)/ruff check services tests docs/hooks examples
	$(BIN)/ruff format --check services tests docs/hooks examples

typecheck: install ## mypy --strict
	$(BIN)/mypy

format: install ## apply ruff's formatting and safe fixes
	$(BIN)/ruff format services tests docs/hooks examples
	$(BIN)/ruff check --fix services tests docs/hooks examples

schemas: install ## regenerate schemas/ from the pydantic models
	$(BIN)/python -m rl_export.formats.schemas schemas

docs: install ## the docs site (MkDocs, Material) into site/, with --strict: a broken link fails
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

unit: install ## the fast unit tests only
	$(BIN)/python -m pytest -m "not integration" $(XDIST) $(PYTEST_ARGS)

integration: install ## the integration tests (real Kafka broker and SeaweedFS), the short soak aside
	$(BIN)/python -m pytest -m "integration and not soak" $(XDIST) $(PYTEST_ARGS)

# pytest exits 5 when it collected no tests: for us that is a failure, not a pass. The short
# soak (every fault at once, about 100 s) runs in `make soak`, before the long one.
test: lint typecheck ## the whole suite: lint, types, unit tests, the strict docs build, integration tests (PYTEST_WORKERS=2 processes)
	@$(BIN)/python -m pytest -m "not soak" $(XDIST) $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The trainers extra (torch with its CUDA libraries from PyPI, ~6 GB, ~5 minutes) is installed
# only here, and tests/trainers/ runs only here: `make test` leaves that folder out
# (norecursedirs in pyproject.toml). Installed without `dev`, whose transformers (>= 5.25, the
# render matrix's) verl 0.9.1 refuses (< 5.11): here pip moves transformers to verl's range,
# and the `kernels` package the newer one required goes (transformers 5.10 fails to import
# its hub integration with that version).
$(TRAINERS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[trainers]"
	$(BIN)/pip uninstall --quiet --yes kernels
	@touch $(TRAINERS_STAMP)

test-trainers: $(TRAINERS_STAMP) ## TRL and verl on the exports, a tiny model built locally on CPU (installs the trainers extra)
	@$(BIN)/python -m pytest tests/trainers $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test-trainers: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The engines extra (PySpark, delta-spark, Polars, pandas) and Spark's jars are installed only
# here, and tests/engines/ runs only here (norecursedirs in pyproject.toml). Spark needs Java
# 17 or later (make prereqs checks it).
$(ENGINES_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e ".[engines]"
	@touch $(ENGINES_STAMP)

$(SPARK_JARS)/.fetched: deploy/spark/pom.xml
	@echo "fetching Delta Lake's and S3A's jars for Spark from Maven Central ..."
	@mkdir -p $(SPARK_JARS)
	mvn -q -B -f deploy/spark/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory="$(abspath $(SPARK_JARS))" \
	  || { echo "make: mvn could not fetch Spark's Delta Lake jars" >&2; exit 1; }
	@touch $@

test-engines: $(ENGINES_STAMP) $(SPARK_JARS)/.fetched ## Spark (delta-spark), Polars and pandas read the corpora's open tables and equal our latest view (installs the engines extra)
	@SPARK_JARS_DIR="$(abspath $(SPARK_JARS))" $(BIN)/python -m pytest tests/engines $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test-engines: pytest collected no tests" >&2; exit 1; fi; exit $$rc

clean: ## remove the virtualenv, caches, var/ and site/ (the Kafka jars in .cache/ are kept)
	rm -rf $(VENV) var site .mypy_cache .ruff_cache .pytest_cache .hypothesis native/target

bench: install ## benchmarks: the worker (vs a bare consumer, ~100k events, standard and small shapes; BASELINE=<checkout>: its worker interleaved), bench-export, bench-web
	$(BIN)/python -m tests.perf.bench $(if $(BASELINE),--baseline $(BASELINE))
	$(BIN)/python -m tests.perf.bench_export
	$(BIN)/python -m tests.perf.bench_web
	$(BIN)/python -m tests.perf.bench_compare

bench-ab: install ## one worker with other settings against the defaults, on one backlog: AB="join_processes=1" (SHAPE=small)
	$(BIN)/python -m tests.perf.bench_ab --variant "" --variant "$(AB)" $(if $(SHAPE),--shape $(SHAPE))

bench-ceiling: install ## one worker against the same worker with its join replayed (its own work free): what a faster join could give (SHAPE=small)
	$(BIN)/python -m tests.perf.ceiling $(if $(SHAPE),--shape $(SHAPE))

bench-export: install ## export benchmark: 1,000,000 records (the web benchmark's corpus, built once, cached in var/bench/; BASELINE=<checkout>: its code interleaved, same bytes checked)
	$(BIN)/python -m tests.perf.bench_export $(if $(BASELINE),--baseline $(BASELINE)/services --digest)

bench-web: install ## web benchmark: cold start, index catch-up and query latency on 1,000,000 records, label to visible (BASELINE=<checkout>: its cold start beside); the comparison queue and claims (100,000 pairs) and ratings (100,000 comparisons)
	$(BIN)/python -m tests.perf.bench_web $(if $(BASELINE),--baseline $(BASELINE))
	$(BIN)/python -m tests.perf.bench_compare

bench-redact: install ## redaction: the secrets kind's coverage, cost per KB and per record, and the export of 1,000,000 records with --redact none/secrets/all (BASELINE=<checkout>: its code beside)
	$(BIN)/python -m tests.perf.bench_redact $(if $(BASELINE),--baseline $(BASELINE)/services)

bench-agreement: install ## the agreement report over 1,000,000 traces (200,000 multi-labeled), beside the krippendorff package, and each filter's first report through the web index
	$(BIN)/python -m tests.perf.bench_agreement

bench-tenants: install ## object writes per event and per second, and freshness, as the same traffic spreads over 10, 100 and 1,000 projects; a model of the sink's commits beside it, and at 10,000
	$(BIN)/python -m tests.perf.bench_tenants

bench-eos: install ## the exactly-once loop (consume, transform, produce, offsets in the transaction) in aiokafka and in confluent-kafka side by side, small events (BATCH=records per transaction)
	$(BIN)/python -m tests.perf.bench_eos $(if $(BATCH),--batch $(BATCH))

# pip installs a dependency group (PEP 735: `--group`) from 25.1 on: the venv's own pip is
# upgraded first.
$(PEERS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/pip install --quiet --group peers
	@touch $(PEERS_STAMP)

bench-peers: install $(PEERS_STAMP) ## the worker beside the peers a user would pick (Quix Streams, Kafka Streams: a join of the same topics, exactly-once, RocksDB) and a bare consumer: events/s, CPU per event, peak RSS (ROUNDS=n)
	$(BIN)/python -m tests.perf.bench_peers --peers-python $(PEERS_VENV)/bin/python $(if $(ROUNDS),--rounds $(ROUNDS))

bench-isolation: install ## p99 of stats, queue, claim and /readyz, and memory, while every export slot is held by a slow export (20,000 traces)
	$(BIN)/python -m tests.perf.bench_isolation

profile: install ## the join and the sink in process: CPU µs per event, per traffic shape (BASELINE=<checkout>: its code interleaved, each stage beside)
	$(BIN)/python -m tests.perf.profile --shape standard --traces 24000 $(if $(BASELINE),--baseline $(BASELINE) --detail)
	$(BIN)/python -m tests.perf.profile --shape small --traces 24000 $(if $(BASELINE),--baseline $(BASELINE) --detail)

screenshots: install browser ## photograph the pages into docs/screenshots/ (the page tests, in headless Chromium)
	RL_EXPORT_SCREENSHOTS="$(abspath docs/screenshots)" $(BIN)/python -m pytest tests/integration/web/test_page.py $(PYTEST_ARGS)

soak: install ## fault soaks: the short one and the slowest fault scenarios (pytest -m soak), then 2 workers, 10 min of load, 24 SIGKILLs, broker restart, store outages, a pause (SEED=n)
	$(BIN)/python -m pytest -m soak $(PYTEST_ARGS)
	$(BIN)/python -m tests.soak.soak $(if $(SEED),--seed $(SEED))

bench-scaling: install ## 2 -> 4 -> 2 workers under steady load: rebalances, lag drain, moved partitions, static membership and not (PHASE=s per worker count, default 45)
	$(BIN)/python -m tests.perf.bench_scaling --dynamic $(if $(PHASE),--phase $(PHASE))

bench-restart: install ## restart-to-ready and first commits of a worker on 1,000,000 traces (built once in var/)
	$(BIN)/python -m tests.perf.bench_restart
