#!/usr/bin/env bash
# Brings up a one-node kind cluster with the operator installed from the chart, for `make e2e E2E_CLUSTER=kind`.
#
# The in-cluster operator watches only $SMOKE_NAMESPACE: the e2e suite starts its own operator for each
# test's namespace, and two operators must never act on one job. up.sh proves the image, the chart and
# its RBAC by running the example job there to completion.
#
# Writes the cluster's kubeconfig to $E2E_KUBECONFIG (default .kind/kubeconfig) and prints it last.
# Exit codes: 0 ready; 3 no Docker engine (this never counts as a pass); anything else a real failure.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
CLUSTER="${KIND_CLUSTER:-elasticjob-e2e}"
E2E_KUBECONFIG="${E2E_KUBECONFIG:-$ROOT/.kind/kubeconfig}"
# The one version (the chart's appVersion) tags both images, as `make images` and the chart's default do.
VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/elasticjob-operator/Chart.yaml)"
OPERATOR_IMAGE="${OPERATOR_IMAGE:-elasticjob-operator:$VERSION}"
WORKER_IMAGE="${WORKER_IMAGE:-elasticjob-worker:$VERSION-cpu}"
NAMESPACE="${OPERATOR_NAMESPACE:-elasticjob-system}"
SMOKE_NAMESPACE="${SMOKE_NAMESPACE:-elasticjob-smoke}"
HELM="${HELM:-helm}"
KIND="${KIND:-kind}"
EXIT_NO_DOCKER=3

if ! docker info >/dev/null 2>&1; then
    echo "SKIPPED: kind e2e needs a Docker engine (none here)"
    exit "$EXIT_NO_DOCKER"
fi
for tool in "$KIND" "$HELM" kubectl; do
    command -v "$tool" >/dev/null || { echo "up.sh: $tool is not on PATH" >&2; exit 1; }
done

mkdir -p "$(dirname "$E2E_KUBECONFIG")"
if ! "$KIND" get clusters | grep -qx "$CLUSTER"; then
    "$KIND" create cluster --name "$CLUSTER" --config tests/e2e/kind/kind-config.yaml --wait 120s
fi
"$KIND" get kubeconfig --name "$CLUSTER" > "$E2E_KUBECONFIG"
export KUBECONFIG="$E2E_KUBECONFIG"

# TORCH_INDEX_URL (optional) points pip at PyTorch's CPU wheel index, for a small worker image.
docker build -f images/operator.Dockerfile -t "$OPERATOR_IMAGE" .
docker build -f images/worker-cpu.Dockerfile -t "$WORKER_IMAGE" \
    ${TORCH_INDEX_URL:+--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"} .
"$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$WORKER_IMAGE"

kubectl create namespace "$SMOKE_NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
"$HELM" upgrade --install elasticjob charts/elasticjob-operator \
    --namespace "$NAMESPACE" --create-namespace \
    --set image.repository="${OPERATOR_IMAGE%:*}" --set image.tag="${OPERATOR_IMAGE##*:}" \
    --set image.pullPolicy=Never --set logLevel=debug \
    --set watch.allNamespaces=false --set "watch.namespaces={$SMOKE_NAMESPACE}" \
    --wait --timeout 180s
kubectl -n "$NAMESPACE" rollout status deployment/elasticjob-elasticjob-operator --timeout=120s
kubectl wait --for=condition=Established crd/elasticjobs.elasticjob.dev --timeout=60s

kubectl -n "$SMOKE_NAMESPACE" delete elasticjob ddp-example --ignore-not-found --wait=true
kubectl -n "$SMOKE_NAMESPACE" create configmap train-ddp --from-file=examples/train_ddp.py --dry-run=client -o yaml \
    | kubectl apply -f -
# The example as README gives it, but for its public image: the worker image just loaded into the nodes.
sed "s#image: pytorch/pytorch:[^ ]*#image: $WORKER_IMAGE#" examples/elasticjob.yaml \
    | kubectl -n "$SMOKE_NAMESPACE" apply -f -
if ! kubectl -n "$SMOKE_NAMESPACE" wait elasticjob/ddp-example --for=jsonpath='{.status.phase}'=Succeeded \
        --timeout=600s; then
    kubectl -n "$SMOKE_NAMESPACE" get elasticjob,pods,services -o wide || true
    kubectl -n "$NAMESPACE" logs deployment/elasticjob-elasticjob-operator --tail=200 || true
    exit 1
fi

echo "$E2E_KUBECONFIG"
