#!/usr/bin/env bash
# The whole kind e2e: create/reuse the cluster, build+load+install, run the suite.
# Extra arguments go to pytest (e.g. -k sharing). Keep the cluster for reruns; e2e/kind-down.sh
# removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
e2e/kind-up.sh
KUBECONFIG="$PWD/e2e/.kubeconfig" "${PYTHON:-.venv/bin/python}" -m pytest e2e -v "$@"
