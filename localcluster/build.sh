#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl, etcd, kubelet and kube-proxy of one
# Kubernetes release into a cache keyed by version, once.
# The release: ELASTICJOB_K8S_VERSION (`make ... K8S_VERSION=1.33`), a supported minor (its patch below) or a full
# version (1.33.5); unset or empty, the one go.mod pins, built from go.mod. Any other is built from a module that
# version_module.sh writes into the cache beside its bin dir.
# stdout: only the bin dir, as the last line (callers parse it); progress goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pinned=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
[[ -n $pinned ]] || { echo "no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
# The supported minors, each as the newest patch the Go module proxy served when this table was written.
declare -A newest_patch=([1.33]=v1.33.13 [1.34]=v1.34.4 [1.35]=v1.35.4 [1.36]=v1.36.3 [1.37]=v1.37.2)
wanted=${ELASTICJOB_K8S_VERSION:-$pinned}
wanted=${wanted#v}
if [[ $wanted =~ ^1\.[0-9]+$ ]]; then
  version=${newest_patch[$wanted]:-}
elif [[ $wanted =~ ^(1\.[0-9]+)\.[0-9]+$ && -n ${newest_patch[${BASH_REMATCH[1]}]:-} ]]; then
  version=v$wanted
else
  version=
fi
[[ -n $version ]] || {
  echo "Kubernetes $wanted is not supported: give a minor ($(printf '%s\n' "${!newest_patch[@]}" | sort -V | xargs)) or a patch of one (1.33.5)" >&2
  exit 2
}
cache=${ELASTICJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticjob}
bin=$cache/localcluster-$version/bin
# Where `go build` runs: this directory for the pinned release, else that release's own module.
src=$here
[[ $version == "$pinned" ]] || src=$cache/localcluster-$version/module
# --bin-dir: only print where the binaries are (or will be), building nothing (the Makefile puts it on PATH).
[[ ${1:-} == --bin-dir ]] && { echo "$bin"; exit 0; }
# binary name -> Go package
declare -A pkgs=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [etcd]=./cmd/etcd
  # The real nodes' parts (localcluster/realnodes): containerd and runc come from Debian's packages.
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [pause]=./cmd/pause
)
# kind's node image (tests/e2e/kind/node-image.sh) also needs kubeadm; the local cluster does not.
[[ ${1:-} == --with-kubeadm ]] && pkgs[kubeadm]=k8s.io/kubernetes/cmd/kubeadm
# The real nodes' cluster DNS and resource metrics (localcluster/realnodes/systemapps.py); each its own module,
# so `go install` at a pinned version rather than go.mod.
declare -A modules=(
  [coredns]=github.com/coredns/coredns@v1.12.4
  [metrics-server]=sigs.k8s.io/metrics-server/cmd/metrics-server@v0.8.0
)
missing_pkgs() {
  local b
  for b in "${!pkgs[@]}"; do [[ -x $bin/$b ]] || echo "${pkgs[$b]}"; done | sort
}
missing_modules() {
  local b
  for b in "${!modules[@]}"; do [[ -x $bin/$b ]] || echo "$b"; done | sort
}
[[ -z $(missing_pkgs) && -z $(missing_modules) ]] && { echo "$bin"; exit 0; }
command -v go >/dev/null || { echo "the Go toolchain (go) is needed to build the control plane" >&2; exit 1; }
# Two test sessions may ask for the binaries at once: one builds, the other waits and reuses them.
mkdir -p "$cache"
exec 9>"$cache/.build-$version.lock"
flock 9
mapfile -t todo < <(missing_pkgs)
[[ ${#todo[@]} == 0 && -z $(missing_modules) ]] && { echo "$bin"; exit 0; }
source "$here/progress.sh"
minor=${version#v1.}; minor=${minor%%.*}
ldflags="-s -w"
# component-base/version is what the servers report; client-go/pkg/version is what kubectl reports.
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags="$ldflags -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
if ((${#todo[@]})) && [[ ! -f $src/go.mod ]]; then
  echo "writing the Go module of Kubernetes $version into $src" >&2
  bash "$here/version_module.sh" "$version" "$src"
fi
cd "$src"
if ((${#todo[@]})); then
  echo "building Kubernetes $version (${todo[*]##*/}) into $bin (first time only; about 7 minutes on 2 cores)" >&2
fi
rm -rf "$bin.partial" && mkdir -p "$bin.partial"
export CGO_ENABLED=0
# CoreDNS and metrics-server build beside the control plane, not after it: their module downloads (about 50 s from a
# cold module cache, CoreDNS's mostly) hide behind its compiling, and their compiles fill the cores its last links
# (one binary each, single-threaded) leave idle.
# Each `go install` is started directly (its progress through a process substitution), so that $! is the go
# command itself and a failed build elsewhere can stop it.
declare -A installs=() began=()  # pid of a background `go install` -> binary name; binary name -> its start
stop_installs() {
  local pid
  for pid in "${!installs[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_installs EXIT
for name in $(missing_modules); do
  echo "[build $name] go install ${modules[$name]} for the real nodes, beside the control plane" >&2
  GOBIN="$bin.partial" go install -v -trimpath -ldflags "-s -w" "${modules[$name]}" \
    > >(go_progress "build $name" "$SECONDS") 2>&1 &
  installs[$!]=$name began[$name]=$SECONDS
done
if ((${#todo[@]})); then
  go_build_with_progress "build $version" -trimpath -ldflags "$ldflags" -o "$bin.partial/" -- "${todo[@]}"
fi
for pid in "${!installs[@]}"; do
  name=${installs[$pid]}
  rc=0
  wait "$pid" || rc=$?
  unset "installs[$pid]"  # reaped: its pid may be another process's from now on
  ((rc == 0)) || { echo "[build $name] go install ${modules[$name]} failed (exit $rc); its errors are above" >&2; exit 1; }
  echo "[build $name] built in $(_elapsed "${began[$name]}")" >&2
done
# Binaries already in $bin stay (a running cluster may be using them); new ones are renamed in.
if [[ -d $bin ]]; then
  for f in "$bin.partial"/*; do mv -f "$f" "$bin/"; done
  rmdir "$bin.partial"
else
  mv "$bin.partial" "$bin"
fi
echo "$bin"
