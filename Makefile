# Two commands do all set-up on a fresh machine:
#   make demo   - the whole node pipeline on an embedded fake GPU profile (no cluster, no GPU)
#   make test   - the test suite (plus lint and type checks)
# Both create .venv and install the pinned dependencies on first use: `make demo` the runtime
# ones and the demo's (the extra `demo`), `make test` the development tools too (`dev`).
# `make help` lists every target.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The runtime dependencies and the demo's (the test kit's API server validates with the
# Kubernetes schemas): what `make demo` needs. $(STAMP) adds the development tools.
RUN_STAMP := $(VENV)/.installed-demo

.PHONY: demo test lint pytest system-deps proto profiles clean chart e2e e2e-down faults mutate gpu-check
.PHONY: help dev image

$(RUN_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[demo]'
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(RUN_STAMP)
	$(BIN)/dra-driver demo

# The development tools without running anything (`make test` installs them itself).
dev: $(STAMP)

help:
	@echo "make demo        the node pipeline on fake GPUs, six scenes, no cluster, no GPU (installs the runtime deps)"
	@echo "make test        lint, type checks and the test suite (installs the dev tools; Debian packages, saying so first)"
	@echo "make dev         install the dev tools into .venv, run nothing"
	@echo "make lint        ruff, ruff format --check, mypy, hadolint"
	@echo "make pytest      the test suite alone (at most PYTEST_MAX_WORKERS=$(PYTEST_MAX_WORKERS) workers)"
	@echo "make image       build the container image $(IMAGE) with docker or podman (IMAGE=..., CONTAINER_ENGINE=...)"
	@echo "make chart       lint and render the Helm chart, check deployments/static"
	@echo "make e2e         kind cluster, image, chart, then the e2e suite (needs docker, kind, kubectl)"
	@echo "make e2e-down    delete the kind cluster"
	@echo "make faults      the fault suite (a few minutes)"
	@echo "make gpu-check   the real-GPU checks (on a node with NVIDIA GPUs)"
	@echo "make mutate      mutation testing (MODULE=driver|slices|placement|schema|deviceplugin)"
	@echo "make proto       regenerate dra_driver/pb from proto/"
	@echo "make profiles    regenerate the built-in fake GPU profiles"
	@echo "make clean       remove .venv and the tool caches"

# The container image (Dockerfile), tagged as the chart's and deployments/static's default
# image, dra-driver:<version>; IMAGE=registry.example.com/gpu/dra-driver:0.1.0 for a registry.
# Docker when it is installed (kind loads images from it), else podman; CONTAINER_ENGINE picks.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= dra-driver:$(VERSION)
CONTAINER_ENGINE ?= $(shell command -v docker || command -v podman)
image:
	@if [ -z "$(CONTAINER_ENGINE)" ]; then \
		echo "make image: neither docker nor podman is installed: install one (or set CONTAINER_ENGINE)" >&2; \
		exit 2; \
	fi
	@echo "make image: building $(IMAGE) with $(CONTAINER_ENGINE)"
	$(CONTAINER_ENGINE) build -t $(IMAGE) --build-arg VERSION=$(VERSION) \
		--build-arg REVISION=$$(git rev-parse --short HEAD 2>/dev/null || echo unknown) .
	@echo "make image: built $(IMAGE) (for a registry: make image IMAGE=REGISTRY/dra-driver:$(VERSION), then $(notdir $(CONTAINER_ENGINE)) push it)"

test: system-deps lint pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/hadolint Dockerfile

# In parallel workers (pytest-xdist): one per core, at most PYTEST_MAX_WORKERS (the tests run
# agents, API servers and kubelet stand-ins as processes of their own); the 15 slowest tests
# listed at the end (tests/conftest.py starts the known slow ones first).
PYTEST_MAX_WORKERS ?= 4
pytest: $(STAMP)
	$(BIN)/pytest -q -n auto --maxprocesses=$(PYTEST_MAX_WORKERS) --durations=15

# Debian packages the container tests need (podman consumes our CDI specs for real). Installed
# when missing (as root, or through sudo); without either the podman test says why it skips.
SYSTEM_PACKAGES := podman runc busybox-static uidmap
system-deps:
	@if command -v podman >/dev/null && command -v runc >/dev/null && [ -x /bin/busybox ]; then \
		echo "system packages present: $(SYSTEM_PACKAGES)"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "make test: installing the container test's Debian packages with apt-get as root: $(SYSTEM_PACKAGES)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $(SYSTEM_PACKAGES); \
	elif command -v sudo >/dev/null; then \
		echo "make test: installing the container test's Debian packages with sudo apt-get: $(SYSTEM_PACKAGES)"; \
		sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $(SYSTEM_PACKAGES); \
	else \
		echo "note: $(SYSTEM_PACKAGES) missing and no root: the podman test will be skipped"; \
	fi

# The Helm chart through Helm's own engine (helm-python-sdk): lint + Kubernetes 1.37 strict
# schemas for every value set, and deployments/static/ up to date (pytest checks the same).
chart: $(STAMP)
	$(BIN)/python scripts/render_chart.py --check
	$(BIN)/python scripts/render_chart.py --check-static

# The fault suite (docs/faults.md): a few minutes on 2 cores; `make test` runs its --quick form.
faults: $(STAMP)
	$(BIN)/python benchmarks/faults.py

# The real-GPU checks (docs/gpu-check.md), not part of `make test`: on a node with NVIDIA GPUs,
# discovery against nvidia-smi, the plugins with real NVML, a CUDA kernel behind a CDI spec.
# Elsewhere every check is skipped with one reason line. Read-only: no GPU setting is changed.
gpu-check: $(STAMP)
	$(BIN)/pytest -q -m gpu tests/gpu

# kind e2e: needs Docker, kind and kubectl (not available in CI). e2e-down deletes the cluster.
e2e: $(STAMP)
	e2e/run.sh

e2e-down:
	e2e/kind-down.sh

# Mutation testing (mutmut), not part of `make test` or CI: slow on two cores. One group at a
# time with MODULE=driver|slices|placement|schema|deviceplugin; score in docs/mutation.md.
MODULE ?=
MUTATE_CHILDREN ?= 1
mutate: $(STAMP)
	$(BIN)/python scripts/mutate.py $(MODULE) --max-children $(MUTATE_CHILDREN)

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

profiles: $(STAMP)
	$(BIN)/python scripts/gen_profiles.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
