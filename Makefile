# The two commands of the README: `make demo` and `make test`. Both set up everything first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed-stamp
# The DSpark worker side (vLLM on CPU) lives in its own venv, as it lives in its own image.
WORKER_VENV := .venv-worker
WORKER_LOCK := backend_images/cpu/requirements.lock
WORKER_STAMP := $(WORKER_VENV)/.installed-stamp

.PHONY: setup system venv worker-venv tools test unit demo clean

setup: system venv worker-venv tools

# System packages the devstack needs (PostgreSQL server binaries); installed only if missing.
system:
	@bash scripts/install-system-packages.sh

# Tools the tests run that no package manager of this machine has: helm (pinned, checked).
HELM := .tools/helm-3.18.0/helm
tools: $(HELM)

$(HELM): scripts/install-helm.sh
	@bash scripts/install-helm.sh

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	$(VENV)/bin/python -m pip install --quiet -e '.[server,dev]'
	touch $(STAMP)

# Same lock as the CPU image, --no-deps: keeps out the CUDA builds of torchvision/torchaudio/
# torchcodec/triton that PyPI would pull beside the CPU torch (they break vLLM's imports).
worker-venv: $(WORKER_STAMP)

$(WORKER_STAMP): pyproject.toml $(WORKER_LOCK)
	$(PYTHON) -m venv $(WORKER_VENV)
	$(WORKER_VENV)/bin/python -m pip install --quiet --upgrade "pip>=24"
	$(WORKER_VENV)/bin/python -m pip install --quiet --no-deps -r $(WORKER_LOCK)
	$(WORKER_VENV)/bin/python -m pip install --quiet --no-deps -e .
	touch $(WORKER_STAMP)

test: setup
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=25 $(PYTEST_ARGS)

unit: venv tools
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider tests/unit

demo: setup
	$(VENV)/bin/python -m gpustack_dspark.devstack demo $(DEMO_ARGS)

clean:
	rm -rf $(VENV) $(WORKER_VENV) *.egg-info
