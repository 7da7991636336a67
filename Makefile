# One task runner: `make demo` and `make test` each set up what they need from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PIP_VERSION := 26.3
# Everything the tests and the demo use: every extra pyproject.toml declares but the benchmark peers
# (bench), so the daemons, the exports, the shared stores, every framework integration and the tools
# (dev). A new extra needs no line here (docs/extending.md).
EXTRAS := $(shell $(PYTHON) -c 'import tomllib; extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]; print(",".join(e for e in extras if e != "bench"))')
PIP := $(PY) -m pip --quiet --disable-pip-version-check
# Set-up prints one line; a step that fails prints its whole log.
QUIETLY := sh tools/quietly.sh

.PHONY: demo mesh check test lint types unit bench soak workflow conformance proto vectors clean venv constraints zones zones-deps browser-deps node-deps containers containers-deps

include infra/tools.mk

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@echo "setting up $(VENV) (the first run takes a minute)"
	@test -x $(PY) || $(QUIETLY) $(PYTHON) -m venv $(VENV)
	@$(QUIETLY) $(PIP) install --upgrade pip==$(PIP_VERSION)
	@$(QUIETLY) $(PIP) uninstall --yes countersign  # a venv from before the rename to countersign-mesh (ADR 0034)
	@$(QUIETLY) $(PIP) install -c constraints.txt -e '.[$(EXTRAS)]'
	@touch $@

# Resolve pyproject.toml's ranges afresh in a scratch venv and pin the result in constraints.txt.
constraints:
	@echo "resolving constraints.txt (the bench peers included) in a scratch venv (a few minutes)"
	@PYTHON=$(PYTHON) PIP_VERSION=$(PIP_VERSION) EXTRAS=$(EXTRAS),bench sh tools/constraints.sh

demo: $(STAMP)
	$(VENV)/bin/countersign demo

# The demo's mesh left running in .mesh/ (Ctrl-C stops it), to try `countersign verify --verifier`.
mesh: $(STAMP)
	$(VENV)/bin/countersign demo --keep-running --workdir .mesh

# The inner loop, a few minutes: lint, types and the offline tier (pure tests: no socket, no process,
# no service; tests/offline_guard.py fails one that reaches out). No PostgreSQL, root or Docker needed.
check: $(STAMP) lint types
	$(VENV)/bin/pytest -n 2 -m offline -q

test: $(STAMP) lint types unit infra-check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	sh docker/lint.sh

types: $(STAMP)
	$(VENV)/bin/mypy countersign countersign_cli signer verifier coordinator tools bench docker/dev-mesh/demo_flow.py docker/healthcheck.py

# System packages for the three-zone tests (iptables, iproute2), installed by the project itself.
zones-deps:
	sh tools/zones/requirements.sh

# Headless Chromium for the report's browser test (tests/audit), installed by the project itself.
browser-deps:
	sh tools/browser/requirements.sh

# Node and the npm packages of the foreign gRPC client test (tests/node_client), installed by the project.
node-deps:
	sh tools/node/requirements.sh

# Tests that restart shared services or rewire the network run alone, after the parallel run; the
# container tier last, with its own engine.
unit: $(STAMP) zones-deps browser-deps node-deps
	$(VENV)/bin/pytest --ignore=tests/infra -n 2 -m "not exclusive and not containers"
	$(VENV)/bin/pytest --ignore=tests/infra -m "exclusive and not containers"
	@$(MAKE) --no-print-directory containers

# System packages for the container tier (docker.io, docker-compose, mmdebstrap), installed by the project.
containers-deps:
	sh docker/requirements.sh

# The container tier: a Docker engine with host networking only (started here when none runs, stopped
# after), local stand-in base images from Debian packages (cached), then the real image, the compose
# mesh and the store tests on a testcontainers PostgreSQL (tests/docker, marker containers).
containers: $(STAMP) containers-deps
	sh docker/engine.sh run -- sh -c 'sh docker/local-base/build.sh && $(VENV)/bin/pytest -m containers tests/docker'

proto: $(STAMP)
	$(PY) proto/generate.py

vectors: $(STAMP)
	$(PY) tests/vectors/generate.py

# The benchmark-only peers (the bench extra: HDP, Biscuit), installed by the benchmark, not by `make test`.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	@$(QUIETLY) $(PIP) install -c constraints.txt -e '.[$(EXTRAS),bench]'
	@touch $@

bench: $(BENCH_STAMP)
	$(PY) -m bench

# The daemons' memory over 100,000 requests each (minutes; kept out of `make bench`).
soak: $(STAMP)
	$(PY) -m bench --only soak

# The paper's LangGraph experiment (Planner -> Researcher -> Writer on three deployers), then its live
# workflow (parent, A2A child, MCP tool in their own processes), each beside its figures.
workflow: $(STAMP)
	$(PY) -m bench.workflow
	$(PY) -m bench.live_workflow

# Three zones on one machine (network namespaces): latency, issuance and revocation delay; what four
# faults cost signer replicas in every zone (docs/zones.md).
zones: $(STAMP) zones-deps
	$(PY) -m tools.zones measure
	$(PY) -m tools.zones faults

conformance: $(STAMP)
	$(VENV)/bin/countersign conformance --trials 1000

clean: infra-clean
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
