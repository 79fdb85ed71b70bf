#!/usr/bin/env bash
# Installs (Debian's docker.io, where missing) and starts a Docker engine for kind, beside the local cluster.
#
# Why Docker and not podman: kind's podman provider is marked experimental, and kind's node image builder
# (`kind build node-image`, which tests/e2e/kind/node-image.sh follows) speaks Docker. Debian's docker.io is 20.10.
#
# Docker sets the iptables FORWARD policy to DROP when it starts. The local cluster's nodes talk over a bridge
# whose traffic the host's FORWARD chain sees (br_netfilter), so the local cluster accepts its own bridge's traffic
# explicitly (localcluster/network.py ensure_bridge) and works whatever the policy; this script only starts
# Docker. The daemon uses cgroupfs (this host's cgroup v1 has no systemd as init) and logs to
# /var/log/elasticjob-dockerd.log. Idempotent: a no-op when `docker info` answers. Run as root.
# Exit codes: 0 the engine answers; 1 it could not be installed or started (the reason on stderr).
set -euo pipefail
LOG=/var/log/elasticjob-dockerd.log
RUNTIME=/usr/local/libexec/elasticjob/runc-bounded
DOCKER_BIN=/usr/bin/docker  # Debian's CLI; another docker on PATH may be a newer client only
[[ -x $DOCKER_BIN ]] || DOCKER_BIN=$(command -v docker || true)

if [[ -n $DOCKER_BIN ]] && "$DOCKER_BIN" info >/dev/null 2>&1; then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "container-engine: no Docker engine answers; run this script as root to install and start one" >&2
  exit 1
fi
if ! command -v dockerd >/dev/null; then
  echo "container-engine: installing docker.io (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2 || { echo "container-engine: apt-get update failed" >&2; exit 1; }
  apt-get install -y -q --no-install-recommends docker.io >&2 || {
    echo "container-engine: apt-get install docker.io failed" >&2; exit 1; }
  DOCKER_BIN=/usr/bin/docker
fi
# runc through runcbounded.py: a privileged container (a kind node) asks for every capability, and this host's
# bounding set lacks CAP_SYS_RESOURCE; the wrapper drops only what the bounding set lacks (nothing elsewhere).
install -D -m 0755 "$(dirname "$0")/localcluster/runcbounded.py" "$RUNTIME"
if [[ ! -e /etc/docker/daemon.json ]]; then
  mkdir -p /etc/docker
  # cgroupfs: no systemd runs as init here. The log limits keep a long kind run's node logs off the disk.
  cat > /etc/docker/daemon.json <<EOF
{
  "exec-opts": ["native.cgroupdriver=cgroupfs"],
  "runtimes": {"runc-bounded": {"path": "$RUNTIME"}},
  "default-runtime": "runc-bounded",
  "log-driver": "json-file",
  "log-opts": {"max-size": "20m", "max-file": "2"}
}
EOF
elif ! grep -q runc-bounded /etc/docker/daemon.json; then
  echo "container-engine: /etc/docker/daemon.json is not this script's; kind nodes need its runc-bounded runtime" \
    "where the capability bounding set lacks one (grep CapBnd /proc/self/status)" >&2
fi
if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
  systemctl start docker
else
  echo "container-engine: starting dockerd (log: $LOG)" >&2
  nohup dockerd >>"$LOG" 2>&1 </dev/null &
fi
for _ in $(seq 1 120); do
  "$DOCKER_BIN" info >/dev/null 2>&1 && { echo "container-engine: Docker $("$DOCKER_BIN" version --format '{{.Server.Version}}') answers" >&2; exit 0; }
  sleep 0.5
done
echo "container-engine: dockerd did not answer within 60 s; its log: $LOG" >&2
tail -n 20 "$LOG" >&2 || true
exit 1
