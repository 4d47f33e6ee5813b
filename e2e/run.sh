#!/usr/bin/env bash
# The whole e2e: create/reuse the kind cluster, build+load+install, run the suite. Extra
# arguments go to pytest (e.g. -k sharing). Keep the cluster for reruns; e2e/kind-down.sh
# removes it.
# E2E_KUBECONFIG=<file>: run the suite against that cluster instead (chart installed there as
# docs/e2e.md says); no kind, no image build. A KUBECONFIG already in the environment is not
# used on purpose: the suite changes the cluster (it rolls the agent DaemonSet, fakes GPU faults).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if [ -n "${E2E_KUBECONFIG:-}" ]; then
  export KUBECONFIG="$E2E_KUBECONFIG"
else
  e2e/kind-up.sh
  export KUBECONFIG="$PWD/e2e/.kubeconfig"
fi
"$PY" -m pytest e2e -v -rs --durations=10 "$@"
