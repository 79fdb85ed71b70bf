#!/usr/bin/env bash
# Writes the Go module that builds Kubernetes VERSION (one other than the one localcluster/go.mod pins) into DIR:
# go.mod requires k8s.io/kubernetes VERSION and the etcd server that release pins, and replaces every staging
# module of that release (its own go.mod lists them) with the v0 tag of the same patch (the scheduler-plugins
# technique); cmd/etcd, cmd/pause and tools.go are copied from here; `go mod tidy` fills in the rest.
# Usage: version_module.sh VERSION DIR   (VERSION like v1.33.13; DIR is replaced only when complete)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=${1:?version}
dir=${2:?module dir}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a Kubernetes version: $version" >&2; exit 2; }
staging_version=v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}
# The release's own go.mod, from the module cache (downloaded through the Go module proxy when absent).
upstream=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
[[ -f $upstream ]] || { echo "the module proxy has no k8s.io/kubernetes $version" >&2; exit 1; }
etcd=$(awk '$1=="go.etcd.io/etcd/server/v3" {print $2; exit}' "$upstream")
[[ -n $etcd ]] || { echo "k8s.io/kubernetes $version pins no go.etcd.io/etcd/server/v3" >&2; exit 1; }
mapfile -t staging < <(awk '$2=="=>" && $3 ~ /^\.\/staging\/src\// {print $1}' "$upstream")
((${#staging[@]})) || { echo "k8s.io/kubernetes $version replaces no staging module" >&2; exit 1; }

rm -rf "$dir.partial" && mkdir -p "$dir.partial"
{
  echo "// Written by localcluster/version_module.sh for Kubernetes $version; \`go mod tidy\` filled in the rest."
  echo "module $(awk '$1=="module" {print $2; exit}' "$here/go.mod")"
  echo
  awk '$1=="go" {print; exit}' "$here/go.mod"
  # The release's GODEBUG defaults, as its own build has them.
  grep -E '^godebug ' "$upstream" || true
  echo
  echo "require ("
  echo "	go.etcd.io/etcd/server/v3 $etcd"
  echo "	k8s.io/kubernetes $version"
  echo ")"
  echo
  echo "replace ("
  for module in "${staging[@]}"; do echo "	$module => $module $staging_version"; done
  echo ")"
} >"$dir.partial/go.mod"
mkdir -p "$dir.partial/cmd"
cp -r "$here/cmd/etcd" "$here/cmd/pause" "$dir.partial/cmd/"
cp "$here/tools.go" "$dir.partial/"
echo "[module $version] go mod tidy (etcd $etcd, ${#staging[@]} staging modules at $staging_version)" >&2
(cd "$dir.partial" && go mod tidy) >&2
rm -rf "$dir" && mv "$dir.partial" "$dir"
