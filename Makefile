# Two commands do all set-up on a fresh machine:
#   make demo   - the whole node pipeline on an embedded fake GPU profile (no cluster, no GPU)
#   make test   - the test suite (plus lint and type checks)
# Both create .venv and install the pinned dependencies on first use.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint pytest system-deps proto profiles clean chart e2e e2e-down faults mutate gpu-check

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dra-driver demo

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
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends $(SYSTEM_PACKAGES); \
	elif command -v sudo >/dev/null; then \
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
