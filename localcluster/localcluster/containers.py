"""Pure translation of a container spec into what the shim runs: command, env, working dir and bind mounts.

The image is ignored: the repo's virtualenv stands in for it, so `python` and `torchrun` resolve to `.venv/bin`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path

from kubernetes.utils.quantity import parse_quantity

from .images import ImageConfig

# lookup(kind, namespace, name, key) -> value or None; kind is "configmap" or "secret".
Lookup = Callable[[str, str, str, str | None], object]

DEFAULT_TERMINATION_PATH = "/dev/termination-log"
IMAGE_WORKSPACE = "/workspace"  # where the worker image keeps the repo's examples (images/worker.Dockerfile)
VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined vars are replaced, undefined ones stay as written, $$ escapes."""

    def repl(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return VAR_REF.sub(repl, text)


def field_value(pod: dict, path: str) -> str:
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return simple[path] or ""
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise ValueError(f"unsupported fieldRef {path}")


def resource_value(container: dict, ref: dict, node_allocatable: dict) -> str:
    resource = ref["resource"]  # e.g. limits.cpu, requests.memory
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        raw = node_allocatable.get(name, "0")  # an unset limit reads as the node's allocatable, as in a kubelet
    divisor = parse_quantity(ref.get("divisor") or "1") or 1  # the apiserver stores an unset divisor as "0"
    return str(math.ceil(parse_quantity(raw) / divisor))


def _env_name(name: str) -> str:
    return name.replace("-", "_").upper()


def service_env(services: list[dict]) -> dict[str, str]:
    """The variables a kubelet derives from Services (pkg/kubelet/envvars): FOO_SERVICE_HOST, FOO_SERVICE_PORT,
    FOO_SERVICE_PORT_<NAME> per named port, and the Docker-links FOO_PORT, FOO_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR].
    Headless Services and those without a ClusterIP give none."""
    env: dict[str, str] = {}
    for svc in services:
        spec = svc.get("spec") or {}
        ip, ports = spec.get("clusterIP"), spec.get("ports") or []
        if not ip or ip == "None" or not ports:
            continue
        prefix = _env_name(svc["metadata"]["name"])
        env[f"{prefix}_SERVICE_HOST"] = ip
        env[f"{prefix}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                env[f"{prefix}_SERVICE_PORT_{_env_name(port['name'])}"] = str(port["port"])
        for i, port in enumerate(ports):
            proto = (port.get("protocol") or "TCP").lower()
            url = f"{proto}://{ip}:{port['port']}"
            if i == 0:
                env[f"{prefix}_PORT"] = url
            link = f"{prefix}_PORT_{port['port']}_{proto.upper()}"
            env.update({link: url, f"{link}_PROTO": proto, f"{link}_PORT": str(port["port"]), f"{link}_ADDR": ip})
    return env


def resolve_env(pod: dict, container: dict, lookup: Lookup, node_allocatable: dict) -> dict[str, str]:
    ns = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            if key in source:
                data = lookup(kind, ns, source[key]["name"], None) or {}
                env.update({prefix + k: v for k, v in data.items()})
    for var in container.get("env") or []:
        env[var["name"]] = env_value(pod, container, var, env, lookup, node_allocatable)
    return env


def env_value(pod, container, var, env_so_far, lookup: Lookup, node_allocatable) -> str:
    if "valueFrom" not in var:
        return expand(var.get("value", ""), env_so_far)
    source = var["valueFrom"]
    if "fieldRef" in source:
        return field_value(pod, source["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in source:
        return resource_value(container, source["resourceFieldRef"], node_allocatable)
    for kind, key in (("configmap", "configMapKeyRef"), ("secret", "secretKeyRef")):
        if key in source:
            ref = source[key]
            value = lookup(kind, pod["metadata"]["namespace"], ref["name"], ref["key"])
            if value is None and not ref.get("optional"):
                raise LookupError(f"{kind} {ref['name']} key {ref['key']} not found")
            return value or ""
    raise ValueError(f"unsupported valueFrom in env {var['name']}")


def command_line(container: dict, env: dict[str, str], image: ImageConfig | None = None) -> list[str]:
    """Kubernetes' rules: `command` replaces the image's ENTRYPOINT, `args` its CMD. A known image (images.py)
    supplies both; any other image has neither here, so its `args` alone are taken as the command. A stand-in
    image runs its own program whatever the container names."""
    if image is not None and image.program:
        return list(image.program)
    command, args = list(container.get("command") or []), list(container.get("args") or [])
    if image is not None and not command:
        command, args = list(image.entrypoint), args or list(image.cmd)
    argv = command + args
    if not argv:
        raise ValueError(f"container {container['name']} has no command or args (images are not run)")
    return [expand(a, env) for a in argv]


def mounts(container: dict, volumes: dict[str, str], termination_file: Path, hosts_file: Path,
           workspace: Path | None = None) -> list[dict]:
    """Bind mounts in order: the image's /workspace (the repo stands in for it), volumes, termination log, hosts."""
    result = [{"source": str(workspace), "target": IMAGE_WORKSPACE}] if workspace else []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in volumes:
            raise ValueError(f"volume {vm['name']} is not hostPath or emptyDir (unsupported here)")
        source = volumes[vm["name"]]
        if vm.get("subPath"):
            source = str(Path(source) / vm["subPath"])
        result.append({"source": source, "target": vm["mountPath"], "readOnly": bool(vm.get("readOnly"))})
    path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH
    result.append({"source": str(termination_file), "target": path, "file": True})
    result.append({"source": str(hosts_file), "target": "/etc/hosts", "file": True})
    result.append({"source": str(hosts_file.with_name("resolv.conf")), "target": "/etc/resolv.conf", "file": True})
    return result


# No DNS server is reachable from a pod's network namespace; asking one there means waiting for timeouts
# (torch's c10d looks up peer names and lost 10-15 s per lookup). Nothing listens on the pod's own
# loopback, so lookups fail at once, as they would quickly against a cluster's DNS.
RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"


def hosts_text(pod_name: str, pod_ip: str) -> str:
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{pod_ip}\t{pod_name}\n"


def termination_message(container: dict, file_text: str, log_tail: str, exit_code: int) -> str:
    message = file_text[:4096]
    if not message.strip() and exit_code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        lines = log_tail.splitlines()[-80:]
        message = "\n".join(lines)[-2048:]
    return message
