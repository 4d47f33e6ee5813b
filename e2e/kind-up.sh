#!/usr/bin/env bash
# Create the kind e2e cluster, build the image and load it into the nodes, install the chart with
# fake GPUs (a different profile per worker, see kind-config.yaml) and wait for the agents.
# Needs a running Docker engine, kind >= 0.32 (a v1.36 node image) and kubectl; `helm` is used
# when present, otherwise the chart is rendered by Helm's engine (scripts/render_chart.py) and
# applied.
# Prints the KUBECONFIG to use. Environment: KIND_CLUSTER, KIND_NODE_IMAGE, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER:-dra-driver-e2e}
NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.36.1}
IMAGE=dra-driver:e2e
NAMESPACE=dra-driver
PY=${PYTHON:-.venv/bin/python}
export KUBECONFIG="$PWD/e2e/.kubeconfig"

need() {
  command -v "$1" >/dev/null 2>&1 || { echo "kind-up: '$1' not found: $2" >&2; exit 2; }
}
need docker "install Docker; image builds need a running engine"
need kind "install kind >= 0.32 (kind.sigs.k8s.io)"
need kubectl "install kubectl"
docker info >/dev/null 2>&1 || { echo "kind-up: no Docker engine is running" >&2; exit 2; }
# The suite (pytest) and, without helm, the chart renderer (Helm's engine from PyPI) are dev tools.
"$PY" -c 'import pytest, helm_python' 2>/dev/null \
  || { echo "kind-up: $PY lacks the dev tools: run 'make dev' (or 'make test') once" >&2; exit 2; }

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "kind-up: reusing cluster $CLUSTER"
else
  kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" \
    --config e2e/kind-config.yaml --wait 180s
fi
kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG"

# The image as `make image` builds it, under the tag e2e/values-kind.yaml names; docker, since
# `kind load docker-image` reads docker's image store.
make --no-print-directory image IMAGE="$IMAGE" CONTAINER_ENGINE=docker
kind load docker-image "$IMAGE" --name "$CLUSTER"

if command -v helm >/dev/null 2>&1; then
  helm upgrade --install dra-driver deployments/helm/dra-driver --namespace "$NAMESPACE" \
    --create-namespace -f e2e/values-kind.yaml
else
  kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
  "$PY" scripts/render_chart.py -f e2e/values-kind.yaml --namespace "$NAMESPACE" \
    | kubectl apply --server-side --force-conflicts -f -
fi
# A rebuilt image keeps its tag: restart the agents so they run it.
kubectl -n "$NAMESPACE" rollout restart daemonset -l app.kubernetes.io/instance=dra-driver
for ds in $(kubectl -n "$NAMESPACE" get daemonset -l app.kubernetes.io/instance=dra-driver -o name); do
  kubectl -n "$NAMESPACE" rollout status "$ds" --timeout=180s
done
echo "kind-up: ready; export KUBECONFIG=$KUBECONFIG"
