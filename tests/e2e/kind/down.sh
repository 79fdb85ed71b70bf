#!/usr/bin/env bash
# Deletes the kind cluster up.sh made and the host routes up.sh added to its subnets; Docker stays running
# (`pkill dockerd` stops the engine localcluster/container-engine.sh started).
set -euo pipefail
CLUSTER="${KIND_CLUSTER:-elasticjob-e2e}"
KIND="${KIND:-kind}"
DOCKER=/usr/bin/docker
[[ -x $DOCKER ]] || DOCKER=docker
DOCKER_DIR="$(dirname "$DOCKER")"
export PATH="$DOCKER_DIR:$PATH"
if "$DOCKER" info >/dev/null 2>&1 && "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    "$KIND" delete cluster --name "$CLUSTER"
fi
for subnet in 10.250.0.0/16 10.251.0.0/16; do  # up.sh's POD_SUBNET and SERVICE_SUBNET
    ip route del "$subnet" 2>/dev/null || true
done
