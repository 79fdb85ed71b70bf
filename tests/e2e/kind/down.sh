#!/usr/bin/env bash
# Deletes the kind cluster that up.sh created (exit 3 when there is no Docker engine, as up.sh).
set -euo pipefail
if ! docker info >/dev/null 2>&1; then
    echo "SKIPPED: kind e2e needs a Docker engine (none here)"
    exit 3
fi
"${KIND:-kind}" delete cluster --name "${KIND_CLUSTER:-elasticjob-e2e}"
