#!/usr/bin/env bash
# Delete the kind e2e cluster and its kubeconfig. Environment: KIND_CLUSTER.
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTER=${KIND_CLUSTER:-dra-driver-e2e}
command -v kind >/dev/null 2>&1 || { echo "kind-down: 'kind' not found" >&2; exit 2; }
kind delete cluster --name "$CLUSTER"
rm -f e2e/.kubeconfig
