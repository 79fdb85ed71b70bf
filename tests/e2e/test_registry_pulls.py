"""Images pulled from the local registry through the pull secret, a wrong secret shown on the job, and a pull
secret that cannot push.

The chart's `jobImagePullSecrets` names the namespace's Secret `elasticjob-registry` (the namespace fixture makes
it; the registry asks for a password). The Secret is replaced by one with a wrong password, and the job's worker
asks to pull its image every time (`imagePullPolicy: Always`), so the node's copy does not help: the worker cannot
start, the job's condition says so with the kubelet's reason, and nothing is charged. With the right Secret back,
the kubelet's next pull succeeds and the same job trains to Succeeded. Real nodes and the local registry only.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from kubernetes import client

from e2e_support import job_manifest, train_args
from helpers import wait_for
from localcluster import registry
from localcluster.layout import Layout

ROOT = Path(__file__).resolve().parents[2]
PULL_REFUSED = ("ErrImagePull", "ImagePullBackOff")
# The kubelet retries a refused pull after 10, 20, 40 s...: two retries and the training fit in this.
RETRY_TIMEOUT = 240


def messages(status: dict) -> str:
    """The job's message (what `kubectl get ej` and `describe` show) and its conditions'."""
    return "\n".join([status.get("message") or "", *(c.get("message") or "" for c in status.get("conditions") or [])])


def wrong_credentials(secret: client.V1Secret) -> dict:
    config = json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))
    for entry in config["auths"].values():
        entry["password"] = "not-the-password"
        entry["auth"] = base64.b64encode(f"{entry['username']}:not-the-password".encode()).decode()
    return {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}


@pytest.fixture
def local_registry_pulls(cluster) -> None:
    """Skips where the nodes do not pull from the local registry; requested before `operator`."""
    if not cluster.pulls_from_registry:
        pytest.skip("no local registry: the nodes import the images")


@pytest.mark.slow  # make e2e: make test pulls every image with the right secret (and proves it cannot push)
def test_a_wrong_pull_secret_is_shown_on_the_job_and_the_right_one_lets_it_train(real_nodes, local_registry_pulls,
                                                                                 operator, jobs):
    core = jobs.core
    secret = core.read_namespaced_secret(registry.PULL_SECRET, jobs.namespace)
    right = dict(secret.data)
    core.patch_namespaced_secret(registry.PULL_SECRET, jobs.namespace, {"data": wrong_credentials(secret)})

    manifest = job_manifest(jobs.namespace, replicas=1, min_replicas=1, max_replicas=1,
                            train_args=train_args(30, step_seconds=0.05))
    (worker,) = manifest["spec"]["template"]["spec"]["containers"]
    worker["imagePullPolicy"] = "Always"
    jobs.create(manifest)
    status = wait_for(jobs.status, RETRY_TIMEOUT, "the job to say its worker cannot pull its image",
                      until=lambda s: "cannot start" in messages(s) and any(r in messages(s) for r in PULL_REFUSED))
    assert status.get("phase") == "Pending", status
    assert "401 Unauthorized" in status.get("message", ""), f"the registry's answer is not on the job: {status}"
    refused = [e for e in core.list_namespaced_event(jobs.namespace).items
               if e.reason == "Failed" and e.involved_object.kind == "Pod" and "pull" in (e.message or "").lower()]
    assert refused and any("401" in e.message or "nauthorized" in e.message for e in refused), (
        f"the kubelet's refusal does not name the registry's answer: {[e.message for e in refused]}")

    core.patch_namespaced_secret(registry.PULL_SECRET, jobs.namespace, {"data": right})
    done = wait_for(jobs.status, RETRY_TIMEOUT, "the job to train to Succeeded once the Secret is right",
                    until=lambda s: s.get("phase") in ("Succeeded", "Failed"))
    assert done["phase"] == "Succeeded", done
    assert (done.get("restarts") or 0) == 0, f"a refused pull was charged: {done}"


def start_upload(address: str, auth: str, ca: Path) -> int:
    """The status of a blob upload's start (POST /v2/<name>/blobs/uploads/) with basic auth `auth`; an upload
    started is cancelled."""
    context = ssl.create_default_context(cafile=str(ca))
    url = f"https://{address}/v2/elasticjob/upload-probe/blobs/uploads/"
    request = urllib.request.Request(url, method="POST", headers={"Authorization": f"Basic {auth}"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            location = response.headers.get("Location") or ""
            if location:
                cancel = urllib.request.Request(urllib.parse.urljoin(url, location), method="DELETE",
                                                headers={"Authorization": f"Basic {auth}"})
                urllib.request.urlopen(cancel, context=context, timeout=10).close()
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_the_pull_secret_can_pull_and_never_push(real_nodes, local_registry_pulls, jobs):
    """The credential every job namespace holds reaches the registry's read-only side, which refuses writes: a
    pod that reads its namespace's Secret cannot replace the images every job runs. The host pushes through the
    other side, on its loopback."""
    secret = jobs.core.read_namespaced_secret(registry.PULL_SECRET, jobs.namespace)
    (address, entry), = json.loads(base64.b64decode(secret.data[".dockerconfigjson"]))["auths"].items()
    assert address == registry.ADDRESS
    ca = Layout(ROOT).pki / "ca.crt"
    assert start_upload(address, entry["auth"], ca) == 405, "the pull secret's credential may write"
    pusher = base64.b64encode(f"{registry.PUSH_USER}:{registry.password(Layout(ROOT), registry.PUSH)}".encode())
    assert start_upload(address, pusher.decode(), ca) in (401, 405), "the pull side takes writes from anyone"
    assert start_upload(registry.PUSH_ADDRESS, pusher.decode(), ca) == 202
    assert start_upload(registry.PUSH_ADDRESS, entry["auth"], ca) == 401, "the push side knows the pull user"
