# Offline checks of infra/terraform: terraform fmt, checkov, and the pytest suite tests/infra.
#
#   make -f infra/tools.mk infra-check      # from a fresh clone
#   include infra/tools.mk                  # from the top-level Makefile, then `make infra-check`
#
# The tools live in their own virtual environment, .venv-infra at the repository root, installed
# from the exact pins in infra/requirements-infra.txt. It is (re)created only when it is missing
# or when that file changed (a stamp file inside the venv records the last install).
# Every variable here starts with INFRA_ so that the including Makefile's names are untouched.

INFRA_SAVED_DEFAULT_GOAL := $(.DEFAULT_GOAL)
INFRA_DIR          := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
INFRA_REPO_ROOT    := $(patsubst %/,%,$(dir $(INFRA_DIR)))
INFRA_PYTHON       ?= python3
INFRA_VENV         ?= $(INFRA_REPO_ROOT)/.venv-infra
INFRA_REQUIREMENTS := $(INFRA_DIR)/requirements-infra.txt
INFRA_STAMP        := $(INFRA_VENV)/.requirements-infra.stamp
INFRA_TF_DIR       := $(INFRA_DIR)/terraform
INFRA_TERRAFORM    ?= $(shell command -v terraform 2>/dev/null)
INFRA_CHECKOV      := $(INFRA_VENV)/bin/checkov --directory $(INFRA_TF_DIR) --config-file $(INFRA_TF_DIR)/.checkov.yaml --quiet
INFRA_PYTEST_ARGS  ?= -q

.PHONY: infra-check infra-venv infra-fmt infra-checkov infra-test infra-clean

## infra-check: terraform fmt -check (when terraform is installed), checkov, pytest tests/infra
infra-check: infra-fmt infra-checkov infra-test

## infra-venv: create or refresh .venv-infra from infra/requirements-infra.txt
infra-venv: $(INFRA_STAMP)

$(INFRA_STAMP): $(INFRA_REQUIREMENTS)
	@echo "infra: building $(INFRA_VENV) from $(INFRA_REQUIREMENTS)"
	rm -rf "$(INFRA_VENV)"
	$(INFRA_PYTHON) -m venv "$(INFRA_VENV)"
	"$(INFRA_VENV)/bin/python" -m pip install --quiet --disable-pip-version-check --no-input --requirement "$(INFRA_REQUIREMENTS)"
	"$(INFRA_VENV)/bin/python" -m pip check
	touch "$@"

infra-fmt:
	@if [ -n "$(INFRA_TERRAFORM)" ]; then \
		echo "infra: terraform fmt -check -recursive $(INFRA_TF_DIR)"; \
		CHECKPOINT_DISABLE=1 "$(INFRA_TERRAFORM)" fmt -check -recursive -diff "$(INFRA_TF_DIR)" \
			&& CHECKPOINT_DISABLE=1 "$(INFRA_TERRAFORM)" fmt -check -diff "$(INFRA_DIR)/checkov-all-features.tfvars"; \
	else \
		echo "infra: terraform is not on PATH: fmt check skipped (install Terraform >= 1.9 to run it)"; \
	fi

infra-checkov: $(INFRA_STAMP)
	@echo "infra: checkov (defaults)"
	$(INFRA_CHECKOV)
	@echo "infra: checkov (every optional part switched on)"
	$(INFRA_CHECKOV) --var-file "$(INFRA_DIR)/checkov-all-features.tfvars"

infra-test: $(INFRA_STAMP)
	cd "$(INFRA_REPO_ROOT)" && INFRA_REQUIRE_TOOLS=1 "$(INFRA_VENV)/bin/python" -m pytest $(INFRA_PYTEST_ARGS) tests/infra

infra-clean:
	rm -rf "$(INFRA_VENV)"

# Included from another Makefile: leave its default goal alone (even when included on top).
ifneq ($(abspath $(firstword $(MAKEFILE_LIST))),$(INFRA_DIR)/tools.mk)
.DEFAULT_GOAL := $(INFRA_SAVED_DEFAULT_GOAL)
endif
