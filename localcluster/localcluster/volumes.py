"""Pod volumes as host directories, bind-mounted into containers by the shim.

hostPath is used as is (created for DirectoryOrCreate/FileOrCreate); emptyDir is a dir under the pod's state dir;
configMap, secret, downwardAPI and projected volumes (the ServiceAccount token volume the apiserver injects) are
written out once, when the first container starts, and are not refreshed afterwards. Other volume types (PVCs,
...) are refused with CreateContainerConfigError.
"""

from __future__ import annotations

import base64
from pathlib import Path

from kubernetes import client

from . import containers, kube


def materialize(core: client.CoreV1Api, pod: dict, pod_path: Path) -> dict[str, str]:
    result = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        if "hostPath" in vol:
            result[name] = host_path(vol["hostPath"])
            continue
        target = pod_path / "volumes" / name
        target.mkdir(parents=True, exist_ok=True)
        result[name] = str(target)
        if "emptyDir" in vol:
            continue
        files = volume_files(core, pod, vol)
        if files is None:
            raise ValueError(f"volume {name}: type not supported by the local nodes")
        for rel, data in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return result


def host_path(spec: dict) -> str:
    path, kind = Path(spec["path"]), spec.get("type", "")
    if kind == "FileOrCreate" and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    elif kind in ("DirectoryOrCreate", "") and not path.exists():
        path.mkdir(parents=True, exist_ok=True)  # an untyped missing path becomes a dir, as with Docker's binds
    elif kind in ("Directory", "File") and not path.exists():
        raise LookupError(f"hostPath {path} ({kind}) does not exist")
    return str(path)


def volume_files(core, pod: dict, vol: dict) -> dict[str, bytes] | None:
    ns = pod["metadata"]["namespace"]
    if "configMap" in vol:
        return object_files(core, ns, "configmap", vol["configMap"])
    if "secret" in vol:
        return object_files(core, ns, "secret", {**vol["secret"], "name": vol["secret"]["secretName"]})
    if "downwardAPI" in vol:
        return downward_files(pod, vol["downwardAPI"])
    if "projected" in vol:
        files: dict[str, bytes] = {}
        for source in vol["projected"].get("sources") or []:
            files.update(projected_files(core, pod, source))
        return files
    return None


def projected_files(core, pod: dict, source: dict) -> dict[str, bytes]:
    if "serviceAccountToken" in source:
        sat = source["serviceAccountToken"]
        return {sat["path"]: service_account_token(core, pod, sat).encode()}
    if "configMap" in source:
        return object_files(core, pod["metadata"]["namespace"], "configmap", source["configMap"])
    if "secret" in source:
        return object_files(core, pod["metadata"]["namespace"], "secret", source["secret"])
    if "downwardAPI" in source:
        return downward_files(pod, source["downwardAPI"])
    return {}


def object_lookup(core: client.CoreV1Api):
    """containers.Lookup over the API: a whole ConfigMap/Secret (key None) or one key; None when absent."""
    def lookup(kind: str, namespace: str, name: str, key: str | None):
        try:
            data = {k: v.decode() for k, v in object_files(core, namespace, kind, {"name": name}).items()}
        except LookupError:
            return None
        return data if key is None else data.get(key)
    return lookup


def object_files(core, ns: str, kind: str, ref: dict) -> dict[str, bytes]:
    read = core.read_namespaced_config_map if kind == "configmap" else core.read_namespaced_secret
    obj = kube.get_or_none(read, ref["name"], ns)
    if obj is None:
        if ref.get("optional"):
            return {}
        raise LookupError(f"{kind} {ns}/{ref['name']} not found")
    data = obj.get("data") or {}
    raw = {k: base64.b64decode(v) for k, v in data.items()} if kind == "secret" else \
        {k: v.encode() for k, v in data.items()}
    if ref.get("items"):
        return {item["path"]: raw[item["key"]] for item in ref["items"] if item["key"] in raw}
    return raw


def downward_files(pod: dict, spec: dict) -> dict[str, bytes]:
    return {item["path"]: containers.field_value(pod, item["fieldRef"]["fieldPath"]).encode()
            for item in spec.get("items") or [] if "fieldRef" in item}


def service_account_token(core, pod: dict, sat: dict) -> str:
    meta = pod["metadata"]
    body = {"spec": {"audiences": [sat["audience"]] if sat.get("audience") else [],
                     "expirationSeconds": sat.get("expirationSeconds", 3607),
                     "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"], "uid": meta["uid"]}}}
    sa = pod["spec"].get("serviceAccountName") or "default"
    resp = core.create_namespaced_service_account_token(sa, meta["namespace"], body, _preload_content=False)
    return kube.as_dict(resp)["status"]["token"]
