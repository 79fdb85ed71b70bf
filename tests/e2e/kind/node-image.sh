#!/usr/bin/env bash
# Builds a kind node image here, offline: kindest/node and kindest/base cannot be pulled on this machine.
#
# It reproduces kind's node layout (what `kind build node-image` makes from kindest/base) from parts this project
# already builds or installs:
#   1. the base: a Debian root filesystem (mmdebstrap, from the Debian mirror) with kind's package list, Debian's
#      containerd, runc and CNI plugins, and kind's own files (entrypoint, systemd units, containerd config) taken
#      from the kind Go module of KIND_VERSION; imported into Docker with kind's entrypoint;
#   2. the node: kubeadm, kubelet and kubectl of the Kubernetes release of `make test` (localcluster/build.sh,
#      K8S_VERSION) copied in, and the images kubeadm starts imported into the node's containerd: the control
#      plane and etcd (one static binary each, FROM scratch), kube-proxy (on a small Debian root with iptables),
#      CoreDNS and pause (the local cluster's builds); committed as in kind's builder.
# kind's default CNI (kindnetd) is served by no module here: the node carries a bridge CNI configuration instead
# (one node; kind-config-offline.yaml disables kindnetd). Its storage is kind's: rancher's local-path-provisioner.
#
# Cached by content: the image's tag ends in a digest of every input; an existing tag is reused in seconds.
# Prints the image's name last. Needs root, Docker (localcluster/container-engine.sh), mmdebstrap and Go.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$ROOT"
KIND_VERSION="${KIND_VERSION:-v0.33.0}"
LPP_VERSION=v0.0.30  # rancher's local-path-provisioner, kind's storage
SUITE=bookworm
# The kind node's pod subnet (kind-config.yaml's networking.podSubnet); one node owns its first /24.
POD_SUBNET_24="${KIND_POD_SUBNET_24:-10.250.0.0/24}"
CACHE="${ELASTICJOB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/elasticjob}/kind-node"
DOCKER=/usr/bin/docker
[[ -x $DOCKER ]] || DOCKER=docker
BASE_PACKAGES=systemd,conntrack,iptables,nftables,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs
BASE_PACKAGES+=,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins
PROXY_PACKAGES=iptables,nftables,conntrack,iproute2,kmod
log() { echo "[kind-node $SECONDS s] $*" >&2; }

BIN="$(bash localcluster/build.sh --with-kubeadm)"
K8S="v$("$BIN/kubeadm" version -o short | sed 's/^v//')"
KIND_DIR="$(cd /tmp && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -d $KIND_DIR/images/base/files ]] || { echo "node-image: the kind module $KIND_VERSION has no images/base/files" >&2; exit 1; }
FILES="$KIND_DIR/images/base/files"
COREDNS_VERSION="v$("$BIN/coredns" -version | sed -n 's/^CoreDNS-//p')"
ETCD_VERSION="$("$BIN/etcd" --version | sed -n 's/^etcd Version: //p')"

digest() { sha256sum | cut -c1-16; }
base_key="$( { echo "$SUITE $BASE_PACKAGES $POD_SUBNET_24"; sed -n '/^# --- base ---$/,/^# --- end base ---$/p' "$0";
               (cd "$FILES" && find . -type f | sort | xargs sha256sum); } | digest)"
node_key="$( { echo "$base_key $K8S $PROXY_PACKAGES $COREDNS_VERSION $ETCD_VERSION $LPP_VERSION"; cat "$0";
               sha256sum "$BIN"/{kubeadm,kubelet,kubectl,kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy,etcd,coredns,pause} /bin/busybox; } | digest)"
BASE_IMAGE="elasticjob-kind-base:$SUITE-$base_key"
NODE_IMAGE="${KIND_NODE_IMAGE:-elasticjob-kind-node:$K8S-$node_key}"
if "$DOCKER" image inspect "$NODE_IMAGE" >/dev/null 2>&1; then
  log "cached: $NODE_IMAGE"
  echo "$NODE_IMAGE"
  exit 0
fi
mkdir -p "$CACHE"
work="$(mktemp -d "$CACHE/.build.XXXXXX")"
container=""
cleanup() {
  [[ -z $container ]] || "$DOCKER" rm -f -v "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# --- base ---
if ! "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  log "bootstrapping the kind base ($SUITE: $BASE_PACKAGES) with mmdebstrap"
  # The hooks do what kind's base Dockerfile does after its package install; Debian's containerd and runc sit
  # where kind's units look for its own builds.
  mmdebstrap --variant=apt --format=tar --include="$BASE_PACKAGES" \
    --customize-hook="cp -r $FILES/usr/local/bin/. \"\$1\"/usr/local/bin/ && chmod 0755 \"\$1\"/usr/local/bin/*" \
    --customize-hook="mkdir -p \"\$1\"/kind && cp -r $FILES/kind/. \"\$1\"/kind/ && chmod -R u+w,a+rX \"\$1\"/kind && chmod 0755 \"\$1\"/kind/bin/*" \
    --customize-hook="cp -r $FILES/etc/. \"\$1\"/etc/ && chmod -R u+w,a+rX \"\$1\"/etc/containerd \"\$1\"/etc/systemd \"\$1\"/etc/sysctl.d \"\$1\"/etc/default \"\$1\"/etc/crictl.yaml" \
    --customize-hook="ln -sf /usr/bin/containerd /usr/bin/ctr /usr/bin/containerd-shim-runc-v2 \"\$1\"/usr/local/bin/ && ln -sf /usr/sbin/runc \"\$1\"/usr/local/sbin/runc" \
    --customize-hook="mkdir -p \"\$1\"/opt/cni/bin && for p in \"\$1\"/usr/lib/cni/*; do ln -sf /usr/lib/cni/\$(basename \$p) \"\$1\"/opt/cni/bin/; done" \
    --customize-hook="chroot \"\$1\" sh -c 'ctr oci spec | jq \".hooks.createContainer[.hooks.createContainer|length] |= . + {\\\"path\\\": \\\"/kind/bin/mount-product-files.sh\\\"}\" | jq \"del(.process.rlimits)\" > /etc/containerd/cri-base.json'" \
    --customize-hook="find \"\$1\"/lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete; rm -f \"\$1\"/lib/systemd/system/multi-user.target.wants/* \"\$1\"/etc/systemd/system/*.wants/* \"\$1\"/lib/systemd/system/local-fs.target.wants/* \"\$1\"/lib/systemd/system/sockets.target.wants/*udev* \"\$1\"/lib/systemd/system/sockets.target.wants/*initctl* \"\$1\"/lib/systemd/system/basic.target.wants/*" \
    --customize-hook="echo ReadKMsg=no >> \"\$1\"/etc/systemd/journald.conf && ln -sf /usr/lib/systemd/systemd \"\$1\"/sbin/init" \
    --customize-hook="chroot \"\$1\" systemctl enable kubelet.service containerd.service undo-mount-hacks.service && chroot \"\$1\" systemctl mask systemd-binfmt.service" \
    --customize-hook="mkdir -p \"\$1\"/etc/kubernetes/manifests \"\$1\"/etc/cni/net.d" \
    --customize-hook="printf '%s\n' '{\"cniVersion\": \"1.0.0\", \"name\": \"elasticjob-kind\", \"plugins\": [{\"type\": \"bridge\", \"bridge\": \"cni0\", \"isGateway\": true, \"ipMasq\": true, \"hairpinMode\": true, \"ipam\": {\"type\": \"host-local\", \"ranges\": [[{\"subnet\": \"$POD_SUBNET_24\"}]], \"routes\": [{\"dst\": \"0.0.0.0/0\"}]}}, {\"type\": \"portmap\", \"capabilities\": {\"portMappings\": true}}]}' > \"\$1\"/etc/cni/net.d/10-elasticjob-bridge.conflist" \
    --customize-hook="rm -rf \"\$1\"/var/lib/apt/lists/* \"\$1\"/var/cache/apt/*.bin \"\$1\"/usr/share/doc/* \"\$1\"/usr/share/man/*" \
    "$SUITE" "$work/base.tar"
  "$DOCKER" import --change 'ENV container=docker' \
    --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' "$work/base.tar" "$BASE_IMAGE" >/dev/null
  rm -f "$work/base.tar"
  log "base image $BASE_IMAGE"
fi
# --- end base ---

# One image FROM scratch holding one static binary, imported into Docker and listed for the node's containerd.
images=()
scratch_image() {  # binary entrypoint(or "") tag
  local name dir changes=(--change 'ENV PATH=/usr/local/bin:/usr/bin:/bin')
  name="$(basename "$1")"
  dir="$work/$name"
  mkdir -p "$dir/usr/local/bin"
  cp "$1" "$dir/usr/local/bin/$name"
  [[ -z $2 ]] || { ln -sf "usr/local/bin/$name" "$dir/$name"; changes+=(--change "ENTRYPOINT [\"/$name\"]"); }
  tar -C "$dir" -c . | "$DOCKER" import "${changes[@]}" - "$3" >/dev/null
  images+=("$3")
}
log "images of the control plane (Kubernetes $K8S, etcd $ETCD_VERSION, CoreDNS $COREDNS_VERSION)"
for part in kube-apiserver kube-controller-manager kube-scheduler; do
  scratch_image "$BIN/$part" "" "registry.k8s.io/$part:$K8S"
done
scratch_image "$BIN/etcd" "" "registry.k8s.io/etcd:$ETCD_VERSION-0"
scratch_image "$BIN/coredns" entry "registry.k8s.io/coredns/coredns:$COREDNS_VERSION"
# The sandbox image kind's containerd config names; the pause binary is the local cluster's own build.
PAUSE="$(sed -n 's/^[[:space:]]*sandbox_image = "\(.*\)"/\1/p' "$FILES/etc/containerd/config.toml")"
scratch_image "$BIN/pause" entry "$PAUSE"
# kind's storage: rancher's local-path-provisioner from its module, its helper a static busybox (Debian's
# busybox-static, a host package), and kind's own manifest for them read from the kind module, naming these images.
LPP_BIN="${CACHE%/*}/local-path-provisioner-$LPP_VERSION/bin"
if [[ ! -x $LPP_BIN/local-path-provisioner ]]; then
  log "building local-path-provisioner $LPP_VERSION from its module (first time only)"
  (cd /tmp && CGO_ENABLED=0 GOBIN="$LPP_BIN" go install -trimpath -ldflags "-s -w" \
    "github.com/rancher/local-path-provisioner@$LPP_VERSION")
fi
PROVISIONER="elasticjob.local/local-path-provisioner:$LPP_VERSION"
HELPER="elasticjob.local/local-path-helper:busybox"
scratch_image "$LPP_BIN/local-path-provisioner" "" "$PROVISIONER"
mkdir -p "$work/helper/bin"
cp /bin/busybox "$work/helper/bin/busybox"
for applet in sh mkdir rm; do ln -sf busybox "$work/helper/bin/$applet"; done
tar -C "$work/helper" -c . | "$DOCKER" import --change 'ENV PATH=/bin' - "$HELPER" >/dev/null
images+=("$HELPER")
python3 - "$KIND_DIR/pkg/build/nodeimage/const_storage.go" "$PROVISIONER" "$HELPER" > "$work/default-storage.yaml" <<'PY'
import re, sys
source, provisioner, helper = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
manifest = re.search(r"const defaultStorageManifest = `\n(.*?)\n`$", source, re.S | re.M).group(1)
print(manifest.replace("` + storageProvisionerImage + `", provisioner).replace("` + storageHelperImage + `", helper))
PY
grep -q "$PROVISIONER" "$work/default-storage.yaml" || { echo "node-image: kind's storage manifest changed shape" >&2; exit 1; }
log "kube-proxy's root ($PROXY_PACKAGES)"
mmdebstrap --variant=essential --format=tar --include="$PROXY_PACKAGES" \
  --customize-hook="cp $BIN/kube-proxy \"\$1\"/usr/local/bin/kube-proxy" \
  --customize-hook="rm -rf \"\$1\"/var/lib/apt/lists/* \"\$1\"/usr/share/doc/* \"\$1\"/usr/share/man/*" \
  "$SUITE" "$work/proxy.tar"
"$DOCKER" import "$work/proxy.tar" "registry.k8s.io/kube-proxy:$K8S" >/dev/null
rm -f "$work/proxy.tar"
images+=("registry.k8s.io/kube-proxy:$K8S")

log "the node: $NODE_IMAGE"
container="kind-node-build-$node_key-$$"
"$DOCKER" run -d --name "$container" --entrypoint=sleep --security-opt seccomp=unconfined "$BASE_IMAGE" infinity >/dev/null
for binary in kubeadm kubelet kubectl; do
  "$DOCKER" cp "$BIN/$binary" "$container:/usr/bin/$binary"
done
# restrict_oom_score_adj: where Docker's runtime dropped CAP_SYS_RESOURCE (container-engine.sh), no process in the
# node may lower its oom_score_adj, and runc would fail every pod's sandbox trying to (the local cluster's
# containerd sets the same).
"$DOCKER" exec "$container" sh -c "echo $K8S > /kind/version && sed -i -e 's#^\([[:space:]]*sandbox_image = \).*#\1\"$PAUSE\"#' -e 's#restrict_oom_score_adj = false#restrict_oom_score_adj = true#' /etc/containerd/config.toml && grep -q 'restrict_oom_score_adj = true' /etc/containerd/config.toml"
"$DOCKER" exec "$container" mkdir -p /kind/manifests
"$DOCKER" cp "$work/default-storage.yaml" "$container:/kind/manifests/default-storage.yaml"
"$DOCKER" exec "$container" bash -c 'nohup containerd > /dev/null 2>&1 &'
"$DOCKER" exec "$container" bash -c 'for i in $(seq 1 50); do [ -S /run/containerd/containerd.sock ] && ctr version >/dev/null 2>&1 && exit 0; sleep 0.2; done; exit 1'
for image in "${images[@]}"; do
  "$DOCKER" save "$image" | "$DOCKER" exec -i "$container" ctr --namespace=k8s.io images import \
    --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests - >/dev/null
  "$DOCKER" rmi "$image" >/dev/null
done
"$DOCKER" exec "$container" ctr --namespace=k8s.io images list -q >&2
"$DOCKER" exec "$container" pkill containerd || true
"$DOCKER" commit --change 'ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]' "$container" "$NODE_IMAGE" >/dev/null
log "built $NODE_IMAGE ($("$DOCKER" image inspect "$NODE_IMAGE" --format '{{.Size}}' | awk '{printf "%.0f MiB", $1/1048576}'))"
echo "$NODE_IMAGE"
