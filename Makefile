# One task runner: `make demo` and `make test` each set up what they need from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint types unit bench workflow conformance proto vectors clean venv zones zones-deps browser-deps

include infra/tools.mk

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip==26.3
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,export,postgres,aws,langgraph]'
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/countersign demo

test: $(STAMP) lint types unit infra-check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	sh docker/lint.sh

types: $(STAMP)
	$(VENV)/bin/mypy countersign countersign_cli signer verifier coordinator tools bench

# System packages for the three-zone tests (iptables, iproute2), installed by the project itself.
zones-deps:
	sh tools/zones/requirements.sh

# Headless Chromium for the report's browser test (tests/audit), installed by the project itself.
browser-deps:
	sh tools/browser/requirements.sh

# Tests that restart shared services or rewire the network run alone, after the parallel run.
unit: $(STAMP) zones-deps browser-deps
	$(VENV)/bin/pytest --ignore=tests/infra -n 2 -m "not exclusive"
	$(VENV)/bin/pytest --ignore=tests/infra -m exclusive

proto: $(STAMP)
	$(PY) proto/generate.py

vectors: $(STAMP)
	$(PY) tests/vectors/generate.py

bench: $(STAMP)
	$(PY) -m bench

# The paper's LangGraph experiment (Planner -> Researcher -> Writer on three deployers), beside its figures.
workflow: $(STAMP)
	$(PY) -m bench.workflow

# Three zones on one machine (network namespaces): latency, issuance and revocation delay.
zones: $(STAMP) zones-deps
	$(PY) -m tools.zones measure

conformance: $(STAMP)
	$(VENV)/bin/countersign conformance --trials 1000

clean: infra-clean
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
