"""Real nodes for the local cluster: upstream kubelet and kube-proxy, containerd and runc from Debian's packages,
the CNI bridge plugin, one network namespace per node (plan.py says what a node is made of).

`up` adds them to a running control plane, starts the local registry (registry.py) and pushes the project's
images there (the nodes' containerd pulls them with the pod's imagePullSecrets), imports the cluster's own images
(pause, CoreDNS, metrics-server), makes the registry's pull secret in `default`, and starts CoreDNS and
metrics-server; `down` removes them, the registry and everything their pods left. `lose` and `partition` are
the faults a real cluster has: a node whose machine is gone, and a node whose cable is cut.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from localcluster import apply, builds, registry, sessions
from localcluster.health import api_json
from localcluster.imagebuild import push
from localcluster.layout import Layout, load_endpoints
from localcluster.realnodes import gpus, hostproxy, images, netns, netpolicy, node, plan, systemapps

Log = Callable[[str], None]
READY_TIMEOUT = 120.0
IMAGE_CACHE = Path.home() / ".cache" / "elasticjob" / "images"


def binaries(bin_dir: Path) -> dict[str, Path]:
    names = ("kubelet", "kube-proxy", "pause", *(app.binary for app in systemapps.APPS))
    return {name: bin_dir / name for name in names}


def project_images(layout: Layout, log: Log) -> images.ProjectImages:
    """The tarballs of images/*.Dockerfile, built where their inputs changed (imagebuild), from now on in the
    background: controlplane starts this before the Go build, which it does not need; `up` takes the tarballs."""
    return images.ProjectImages(images.imagebuild_argv(IMAGE_CACHE), layout.root, log)


def up(layout: Layout, names: list[str], bin_dir: Path, log: Log, project: images.ProjectImages | None = None) -> None:
    endpoints = load_endpoints(layout)
    if endpoints is None:
        raise RuntimeError("no control plane is running (localcluster up first)")
    everyone = plan.nodes(layout.state, names)
    bins = binaries(bin_dir)
    netpolicy.ensure_binary(layout, log)
    gpus.ensure_binary(layout, log)
    netpolicy.apply_rbac(layout, endpoints)
    registry.ensure(layout, log)
    # Every image is built, and pushed, before a node starts: pods of a running cluster land on a node once it is up.
    with project or project_images(layout, log) as building:
        tarballs = [images.binary_image(IMAGE_CACHE, bins["pause"], plan.PAUSE_IMAGE, log),
                    *(images.binary_image(IMAGE_CACHE, bins[app.binary], app.image, log) for app in systemapps.APPS)]
        project_tarballs = building.tarballs()
    pushed = push.push_all([(spec, t) for t in project_tarballs if (spec := push.spec_of(t))],
                           push.local_target(layout), IMAGE_CACHE, log)
    apply.apply(endpoints, registry.pull_secret("default", registry.password(layout)))
    started = time.monotonic()
    alive = {each.name for each in running(layout)}
    missing = [each for each in everyone if each.name not in alive]
    for each in missing:
        node.start(layout, endpoints, each, everyone, bin_dir)
    images.import_everywhere(everyone, tarballs, log)
    images.pull_everywhere(everyone, sorted(pushed), f"{registry.USER}:{registry.password(layout)}", log)
    if not _alive(layout, hostproxy.NAME):
        hostproxy.start(layout, endpoints, bin_dir, everyone[0].name)
    wait_ready(layout, [n.name for n in everyone], READY_TIMEOUT, log)
    hostproxy.wait_serving(layout)
    log(f"  {len(everyone)} real nodes Ready, {len(missing)} started now ({time.monotonic() - started:.1f}s)")
    systemapps.apply_manifests(layout, log)


def down(layout: Layout, bin_dir: Path, log: Log) -> None:
    hostproxy.stop(layout, bin_dir)
    for each in existing(layout):
        node.stop(layout, each)
        log(f"  stopped {each.name} (kubelet, kube-proxy, network policies, containerd and its pods)")
    if registry.stop(layout):  # either side: one may have died alone
        log(f"  stopped the registry (its blobs stay in {registry.DATA})")


def restart(layout: Layout, name: str) -> None:
    """A lost node back: its processes start again with what its disk kept (images, containerd's state)."""
    endpoints = load_endpoints(layout)
    assert endpoints is not None
    everyone = existing(layout)
    [again] = [each for each in everyone if each.name == name]
    # build.sh's bin dir from builds, as controlplane.bin_dir has it: controlplane imports this package, not back.
    node.start(layout, endpoints, again, everyone, builds.bin_dir(layout.build_script))


def running(layout: Layout) -> list[plan.RealNode]:
    """The real nodes whose processes (node.PARTS) all run."""
    return [each for each in existing(layout)
            if all(_alive(layout, node.component(each, part)) for part in node.PARTS)]


def _alive(layout: Layout, name: str) -> bool:
    pid = sessions.read_pid(layout, name)
    return pid is not None and sessions.ours(layout, pid)


def existing(layout: Layout) -> list[plan.RealNode]:
    """The nodes that have a directory, each at its own index (a node's addresses follow from its index)."""
    root = layout.state / "nodes"
    names = [p.name for p in root.iterdir()] if root.is_dir() else []
    return [plan.RealNode(int(name.rsplit("-", 1)[1]), name, layout.state) for name in sorted(names)]


def wait_ready(layout: Layout, names: list[str], timeout: float, log: Log) -> None:
    endpoints = load_endpoints(layout)
    assert endpoints is not None
    deadline = time.monotonic() + timeout
    while True:
        ready = {n["metadata"]["name"] for n in api_json(endpoints, "/api/v1/nodes").get("items", [])
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
        if set(names) <= ready:
            return
        if time.monotonic() > deadline:
            missing = sorted(set(names) - ready)
            tails = "\n".join(f"--- {name}-kubelet:\n{sessions.tail(layout.log_file(f'{name}-kubelet'), 10)}"
                              for name in missing)
            raise RuntimeError(f"nodes not Ready after {timeout:.0f}s: {', '.join(missing)}\n{tails}")
        time.sleep(1)


__all__ = ["down", "existing", "netns", "running", "up"]
