#!/usr/bin/env bash
# Installs the Debian packages the local cluster's real nodes, image builds and `make lint-workflows` need, where one
# is missing: containerd and runc (the runtime), the CNI plugins, iptables, buildah and mmdebstrap (the images), a
# static busybox (the kit's launcher runs under it in the unit tests, as in job pods) and shellcheck (actionlint
# checks the workflows' run: steps with it).
# Run as root; a no-op (and no apt-get update) when everything is there.
set -euo pipefail
declare -A wanted=(
  [containerd]=containerd [runc]=runc [buildah]=buildah [mmdebstrap]=mmdebstrap [iptables]=iptables
  [nsenter]=util-linux [ip]=iproute2 [nft]=nftables [shellcheck]=shellcheck
)
missing=()
for cmd in "${!wanted[@]}"; do command -v "$cmd" >/dev/null || missing+=("${wanted[$cmd]}"); done
[[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
[[ -x /bin/busybox ]] || missing+=(busybox-static)
((${#missing[@]})) || exit 0
if [[ $(id -u) != 0 ]]; then
  echo "host-packages: missing ${missing[*]}; run this script as root (apt-get install)" >&2
  exit 1
fi
echo "host-packages: installing ${missing[*]} (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2 || { echo "host-packages: apt-get update failed" >&2; exit 1; }
apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 || {
  echo "host-packages: apt-get install ${missing[*]} failed" >&2; exit 1; }
