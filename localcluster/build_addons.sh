#!/usr/bin/env bash
# Builds the local cluster's optional add-ons from the Go modules pinned in schedplugins/go.mod and kueue/go.mod
# into a cache keyed by their versions, once:
#   scheduler-plugins-kube-scheduler  sigs.k8s.io/scheduler-plugins/cmd/scheduler (Coscheduling and the rest)
#   kueue-manager                     sigs.k8s.io/kueue/cmd/kueue
#   kwok-<version>                    sigs.k8s.io/kwok/cmd/kwok (fake nodes; its version in the name, so that a new
#                                     kwok/go.mod builds a new binary beside the others)
#   kube-network-policies-<version>   sigs.k8s.io/kube-network-policies' controller with netpol/main.go (the real
#                                     nodes' NetworkPolicy enforcement; its version in the name, as kwok's)
#   fakegpu-<hash>                    fakegpu/main.go, the real nodes' fake GPU device plugin (its sources' hash
#                                     in the name)
#   registry-<version>                github.com/distribution/distribution/v3/cmd/registry (distribution/go.mod):
#                                     the OCI registry the real nodes pull the project's images and chart from
#   registry-htpasswd-<version>       distribution/htpasswd: its bcrypt password file (x/crypto's bcrypt)
# Arguments name the binaries wanted (default: all), so a caller that needs one does not wait for the other.
# stdout: only the bin dir, as the last line (callers parse it); progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# The version of module $1 required (or replaced) in go.mod $2.
modversion() {
  awk -v m="$1" '$1 !~ "^//" { for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v[0-9]+[.][0-9]+[.][0-9]+/) { print $(i + 1); exit } }' "$2"
}
sp_version=$(modversion sigs.k8s.io/scheduler-plugins "$here/schedplugins/go.mod")
sp_k8s=$(modversion k8s.io/kubernetes "$here/schedplugins/go.mod")
kueue_version=$(modversion sigs.k8s.io/kueue "$here/kueue/go.mod")
kueue_k8s=$(modversion k8s.io/kubernetes "$here/kueue/go.mod")
kwok_version=$(modversion sigs.k8s.io/kwok "$here/kwok/go.mod")
kwok_k8s=$(modversion k8s.io/client-go "$here/kwok/go.mod")
netpol_version=$(modversion sigs.k8s.io/kube-network-policies "$here/netpol/go.mod")
netpol_k8s=$(modversion k8s.io/client-go "$here/netpol/go.mod")
# Our own device plugin: its sources' hash in its name (realnodes/gpus.py computes the same).
fakegpu=fakegpu-$(cat "$here/fakegpu/main.go" "$here/fakegpu/go.mod" "$here/fakegpu/go.sum" | sha256sum | cut -c1-12)
fakegpu_k8s=$(modversion k8s.io/kubelet "$here/fakegpu/go.mod")
registry_version=$(modversion github.com/distribution/distribution/v3 "$here/distribution/go.mod")
for v in sp_version sp_k8s kueue_version kueue_k8s kwok_version kwok_k8s netpol_version netpol_k8s fakegpu_k8s \
  registry_version; do
  [[ -n ${!v} ]] || { echo "build_addons.sh: no $v in schedplugins/, kueue/, kwok/, netpol/, fakegpu/ or distribution/go.mod" >&2; exit 1; }
done
cache=${ELASTICJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticjob}
bin=$cache/addons-scheduler-plugins-$sp_version-kueue-$kueue_version/bin
# --bin-dir: only print where the binaries are (or will be), building nothing (the Makefile puts it on PATH).
[[ ${1:-} == --bin-dir ]] && { echo "$bin"; exit 0; }
# binary name -> "module dir|package|Kubernetes version of its libraries"
declare -A builds=(
  [scheduler-plugins-kube-scheduler]="schedplugins|sigs.k8s.io/scheduler-plugins/cmd/scheduler|$sp_k8s"
  [kueue-manager]="kueue|sigs.k8s.io/kueue/cmd/kueue|$kueue_k8s"
  [kwok-$kwok_version]="kwok|sigs.k8s.io/kwok/cmd/kwok|v1.${kwok_k8s#v0.}"
  [kube-network-policies-$netpol_version]="netpol|github.com/elasticjob-dev/elasticjob-operator/localcluster/netpol|v1.${netpol_k8s#v0.}"
  [$fakegpu]="fakegpu|github.com/elasticjob-dev/elasticjob-operator/localcluster/fakegpu|v1.${fakegpu_k8s#v0.}"
  # No Kubernetes library in these two: the version only fills the ldflags' (unused) component-base fields.
  [registry-$registry_version]="distribution|github.com/distribution/distribution/v3/cmd/registry|v1.0.0"
  [registry-htpasswd-$registry_version]="distribution|github.com/elasticjob-dev/elasticjob-operator/localcluster/distribution/htpasswd|v1.0.0"
)
wanted=("$@")
((${#wanted[@]})) || wanted=("${!builds[@]}")
for b in "${wanted[@]}"; do
  [[ -n ${builds[$b]:-} ]] || { echo "build_addons.sh: unknown binary $b (known: ${!builds[*]})" >&2; exit 2; }
done
missing() {
  local b
  for b in "${wanted[@]}"; do [[ -x $bin/$b ]] || echo "$b"; done | sort
}
[[ -z $(missing) ]] && { echo "$bin"; exit 0; }
command -v go >/dev/null || { echo "the Go toolchain (go) is needed to build the add-ons" >&2; exit 1; }
# Two sessions may ask at once: one builds, the other waits and reuses the binaries.
mkdir -p "$cache"
exec 9>"$cache/.build-addons-$sp_version-$kueue_version.lock"
flock 9
mapfile -t todo < <(missing)
[[ ${#todo[@]} == 0 ]] && { echo "$bin"; exit 0; }
source "$here/progress.sh"
export CGO_ENABLED=0
echo "building ${todo[*]} into $bin (first time only; on 2 cores with cold Go caches about 3.5 minutes for scheduler-plugins, 6-7 for Kueue, 1.5 for kwok after the control plane, 1 for kube-network-policies, 1.5 for the registry)" >&2
rm -rf "$bin.partial" && mkdir -p "$bin.partial"
for b in "${todo[@]}"; do
  IFS='|' read -r dir pkg k8s <<<"${builds[$b]}"
  minor=${k8s#v1.}; minor=${minor%%.*}
  cb=k8s.io/component-base/version
  # The Kubernetes libraries' version, as kube-scheduler derives its binary/emulation version from it.
  ldflags="-s -w -X $cb.gitVersion=$k8s -X $cb.gitMajor=1 -X $cb.gitMinor=$minor -X $cb.gitTreeState=clean"
  ldflags="$ldflags -X $cb.buildDate=1970-01-01T00:00:00Z"
  [[ $b == kueue-manager ]] && ldflags="$ldflags -X sigs.k8s.io/kueue/pkg/version.GitVersion=$kueue_version"
  [[ $b == kueue-manager ]] && ldflags="$ldflags -X sigs.k8s.io/kueue/pkg/version.BuildDate=1970-01-01T00:00:00Z"
  [[ $b == registry-$registry_version ]] && ldflags="$ldflags -X github.com/distribution/distribution/v3/version.version=$registry_version"
  (cd "$here/$dir" && go_build_with_progress "build $b" -trimpath -ldflags "$ldflags" -o "$bin.partial/$b" -- "$pkg")
done
if [[ -d $bin ]]; then
  for f in "$bin.partial"/*; do mv -f "$f" "$bin/"; done
  rmdir "$bin.partial"
else
  mv "$bin.partial" "$bin"
fi
echo "$bin"
