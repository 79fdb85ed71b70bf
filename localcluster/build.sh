#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager and etcd from
# the Go modules pinned in go.mod into a cache keyed by version, once.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
[[ -n $version ]] || { echo "no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
cache=${ELASTICJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticjob}
bin=$cache/localcluster-$version/bin
want=(kube-apiserver kube-scheduler kube-controller-manager etcd)
missing=0
for b in "${want[@]}"; do [[ -x $bin/$b ]] || missing=1; done
if [[ $missing == 0 ]]; then echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "the Go toolchain (go) is needed to build the control plane" >&2; exit 1; }
# Two test sessions may ask for the binaries at once: one builds, the other waits and reuses them.
mkdir -p "$cache"
exec 9>"$cache/.build-$version.lock"
flock 9
missing=0
for b in "${want[@]}"; do [[ -x $bin/$b ]] || missing=1; done
if [[ $missing == 0 ]]; then echo "$bin"; exit 0; fi
mkdir -p "$bin.partial"
minor=${version#v1.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
ldflags="$ldflags -X $pkg.buildDate=1970-01-01T00:00:00Z"
echo "building Kubernetes $version control plane into $bin (first time only; several minutes on 2 cores)" >&2
cd "$here"
CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin.partial/" \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  ./cmd/etcd
rm -rf "$bin" && mv "$bin.partial" "$bin"
echo "$bin"
