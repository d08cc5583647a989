# The two commands of the README: `make demo` and `make test`. Both set up everything first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: setup system venv test unit demo clean

setup: system venv

# System packages the devstack needs (PostgreSQL server binaries); installed only if missing.
system:
	@bash scripts/install-system-packages.sh

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	$(VENV)/bin/python -m pip install --quiet -e '.[server,dev]'
	touch $(STAMP)

test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

unit: venv
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/unit

demo: setup
	$(VENV)/bin/python -m gpustack_dspark.devstack demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) *.egg-info
