#!/usr/bin/env bash
# Brings up a one-node kind cluster with the operator installed from the chart, for `make e2e E2E_CLUSTER=kind`.
#
# The in-cluster operator watches only $SMOKE_NAMESPACE: the e2e suite starts its own operator for each
# test's namespace, and two operators must never act on one job. up.sh proves the image, the chart and
# its RBAC by running the example job there to completion.
#
# Writes the cluster's kubeconfig to $E2E_KUBECONFIG (default .kind/kubeconfig) and prints it last; down.sh undoes it.
# Two node images:
#   KIND_NODE=local (default; this machine, offline): the node image built here (node-image.sh), with
#     kind-config-offline.yaml (a bridge CNI in place of kindnetd), the project's images built by buildah
#     (python -m localcluster.imagebuild) and loaded with `kind load image-archive`;
#   KIND_NODE=published: kindest/node of K8S_VERSION pulled from Docker Hub, kind-config.yaml, the images built
#     with `docker build` (their bases pulled) and loaded with `kind load docker-image`.
# Both pod and Service subnets (10.250/16, 10.251/16) are routed from this host to the node, since the e2e suite
# runs its operator on the host and reads each job's store.
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
KIND="${KIND:-kind}"
KIND_NODE="${KIND_NODE:-local}"
PY="${PY:-$ROOT/.venv/bin/python}"
DOCKER=/usr/bin/docker  # Debian's engine's own CLI where installed (another docker on PATH may be a newer client)
[[ -x $DOCKER ]] || DOCKER=docker
POD_SUBNET=10.250.0.0/16
SERVICE_SUBNET=10.251.0.0/16
EXIT_NO_DOCKER=3
step() { echo "[up.sh $SECONDS s] $*" >&2; }

if ! "$DOCKER" info >/dev/null 2>&1; then
    echo "SKIPPED: kind e2e needs a Docker engine (none here; as root, localcluster/container-engine.sh starts one)"
    exit "$EXIT_NO_DOCKER"
fi
for tool in "$KIND" kubectl; do
    command -v "$tool" >/dev/null || { echo "up.sh: $tool is not on PATH" >&2; exit 1; }
done
# kind runs `docker`: the engine's own CLI first on its PATH.
DOCKER_DIR="$(dirname "$DOCKER")"
export PATH="$DOCKER_DIR:$PATH"

case "$KIND_NODE" in
    local)
        NODE_IMAGE="$(bash tests/e2e/kind/node-image.sh)"
        CONFIG=tests/e2e/kind/kind-config-offline.yaml ;;
    published)
        # The release of `make test` (K8S_VERSION): build.sh names it in its bin dir, built or not.
        BIN_DIR="$(bash localcluster/build.sh --bin-dir)"
        RELEASE="$(basename "$(dirname "$BIN_DIR")")"
        NODE_IMAGE="kindest/node:${RELEASE#localcluster-}"
        CONFIG=tests/e2e/kind/kind-config.yaml ;;
    *) echo "up.sh: KIND_NODE is local or published, not $KIND_NODE" >&2; exit 2 ;;
esac

mkdir -p "$(dirname "$E2E_KUBECONFIG")"
if ! "$KIND" get clusters | grep -qx "$CLUSTER"; then
    step "kind create cluster $CLUSTER ($NODE_IMAGE)"
    "$KIND" create cluster --name "$CLUSTER" --config "$CONFIG" --image "$NODE_IMAGE" --wait 120s
fi
"$KIND" get kubeconfig --name "$CLUSTER" > "$E2E_KUBECONFIG"
export KUBECONFIG="$E2E_KUBECONFIG"
NODE_IP="$("$DOCKER" inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$CLUSTER-control-plane")"
for subnet in "$POD_SUBNET" "$SERVICE_SUBNET"; do
    ip route replace "$subnet" via "$NODE_IP" || { echo "up.sh: routing $subnet to the node needs root" >&2; exit 1; }
done
step "node $NODE_IP; $POD_SUBNET and $SERVICE_SUBNET routed to it"

if [[ $KIND_NODE == local ]]; then
    step "images: python -m localcluster.imagebuild (buildah; cached when nothing changed)"
    mapfile -t tarballs < <("$PY" -m localcluster.imagebuild --only elasticjob-operator --only elasticjob-worker)
    "$KIND" load image-archive --name "$CLUSTER" "${tarballs[@]}"
else
    # TORCH_INDEX_URL (optional) points pip at PyTorch's CPU wheel index, for a small worker image.
    "$DOCKER" build -f images/operator.Dockerfile -t "$OPERATOR_IMAGE" .
    "$DOCKER" build -f images/worker-cpu.Dockerfile -t "$WORKER_IMAGE" \
        ${TORCH_INDEX_URL:+--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"} .
    "$KIND" load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE" "$WORKER_IMAGE"
fi

step "the chart (Helm's SDK), watching $SMOKE_NAMESPACE only"
kubectl create namespace "$SMOKE_NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
"$PY" tests/e2e/kind/install_chart.py --kubeconfig "$E2E_KUBECONFIG" --namespace "$NAMESPACE" \
    --image "$OPERATOR_IMAGE" --watch "$SMOKE_NAMESPACE"
# The same tag may now name a newer image (loaded above): the operator's pods start again from it.
kubectl -n "$NAMESPACE" rollout restart deployment/elasticjob-operator
kubectl -n "$NAMESPACE" rollout status deployment/elasticjob-operator --timeout=120s
kubectl wait --for=condition=Established crd/elasticjobs.elasticjob.dev --timeout=60s

step "smoke: examples/elasticjob.yaml on $WORKER_IMAGE"
kubectl -n "$SMOKE_NAMESPACE" delete elasticjob ddp-example --ignore-not-found --wait=true
kubectl -n "$SMOKE_NAMESPACE" create configmap train-ddp --from-file=examples/train_ddp.py --dry-run=client -o yaml \
    | kubectl apply -f -
# The example as README gives it, but for its public image: the worker image just loaded into the nodes.
sed "s#image: pytorch/pytorch:[^ ]*#image: $WORKER_IMAGE#" examples/elasticjob.yaml \
    | kubectl -n "$SMOKE_NAMESPACE" apply -f -
if ! kubectl -n "$SMOKE_NAMESPACE" wait elasticjob/ddp-example --for=jsonpath='{.status.phase}'=Succeeded \
        --timeout=600s; then
    kubectl -n "$SMOKE_NAMESPACE" get elasticjob,pods,services -o wide || true
    kubectl -n "$NAMESPACE" logs deployment/elasticjob-operator --tail=200 || true
    exit 1
fi

step "the example job Succeeded"
echo "$E2E_KUBECONFIG"
