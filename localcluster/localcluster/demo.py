"""`make run`: the operator doing its job on the local cluster, installed by its Helm chart.

    python -m localcluster.demo [--scenario story|basic]

Starts the local cluster on real nodes (upstream kubelet, containerd, runc, CNI, kube-proxy, CoreDNS) and its
registry if none runs (its `up` builds the images and pushes them there), pushes charts/elasticjob-operator to the
registry as an OCI chart and installs (or upgrades) it from there through Helm's SDK, watching the `default`
namespace; the nodes pull the operator's image (and the kit with it) and the worker image from the registry with
the pull secret `elasticjob-registry`. Then it makes the script's ConfigMap from examples/train_ddp.py and applies
examples/elasticjob.yaml there, its worker image the
registry's.
- story (default): grow the job to 3 nodes with `kubectl scale`, SIGKILL the pod that holds rank 0, SIGKILL the
  rendezvous store, let it finish; a live view meanwhile and a table of what each fault cost at the end.
- basic: follow the job to its end, one plain line per change.
Exits 0 only when the job Succeeded. The operator stays installed; the cluster keeps running.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from rich.console import Console

from . import controlplane, diagnose, examplescript, liveview, operatorchart, registry
from .story import Story, StoryError, summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "elasticjob.yaml"
GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"
NAMESPACE = "default"
BASIC_TIMEOUT = 900
# The chart's defaults, but watching only the namespace the demo uses (other tenants' namespaces are theirs), and
# the operator image from the local registry, pulled with its secret (which the job pods get too).
# One operator pod (the chart's default is two, one leading): the demo follows the log of the one.
CHART_VALUES = {"watch": {"allNamespaces": False, "namespaces": [NAMESPACE]}, "replicas": 1,
                **operatorchart.registry_values()}
# The example's worker image, as `make images` pushed it.
WORKER_IMAGE = registry.image("elasticjob-worker", f"{registry.VERSION}-cpu")


def install_operator(console: Console, kubeconfig: Path, api: client.ApiClient) -> operatorchart.Release:
    started = time.monotonic()
    chart = operatorchart.publish(ROOT)
    console.print(f"chart: helm package charts/elasticjob-operator; helm push to {registry.PUSH_CHARTS} "
                  f"({chart.version}, {chart.digest[:19]})", highlight=False, markup=False)
    for namespace in (operatorchart.NAMESPACE, NAMESPACE):
        operatorchart.ensure_pull_secret(api, namespace, registry.password(operatorchart.Layout(ROOT)))
    console.print(f"operator: helm upgrade --install {operatorchart.RELEASE} {chart.pinned} "
                  f"--namespace {operatorchart.NAMESPACE} --create-namespace --set watch.allNamespaces=false "
                  f"--set watch.namespaces={{{NAMESPACE}}} --set image.repository={registry.REPOSITORY}/"
                  f"elasticjob-operator --set imagePullSecrets[0].name={registry.PULL_SECRET} "
                  f"--set jobImagePullSecrets[0].name={registry.PULL_SECRET} --wait   (Helm's Go SDK, helm-python-sdk)",
                  highlight=False, markup=False)
    release = operatorchart.install_or_upgrade(kubeconfig, CHART_VALUES, chart=chart)
    pod = operatorchart.wait_running(client.CoreV1Api(api), release)
    action = "installed" if release.installed else f"upgraded to revision {release.revision}"
    crds = ("the chart's crds/ applied (Helm never upgrades CRDs)" if release.crds_applied
            else "CRDs installed by Helm from the chart's crds/")
    console.print(f"operator: {action} in {time.monotonic() - started:.1f}s; pod {pod.metadata.name} runs "
                  f"`elasticjob run` (the image's ENTRYPOINT) with the chart's args; {crds}", highlight=False)
    console.print(f"          logs: kubectl -n {release.namespace} logs deploy/{release.fullname}", highlight=False)
    return release


def clear_previous(custom: client.CustomObjectsApi, job: dict, console: Console) -> None:
    """Delete the job a previous run left and its checkpoints, so that training starts from step 0."""
    name = job["metadata"]["name"]
    try:
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        console.print(f"deleted the previous {name}")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
            time.sleep(0.5)
        raise SystemExit(f"the previous {name} is still there after 60s")
    except ApiException as err:
        if err.status != 404:
            raise
    if checkpoints := job["spec"].get("checkpointDir"):
        shutil.rmtree(Path(checkpoints).parent, ignore_errors=True)


def basic(api: client.ApiClient, job: dict, console: Console) -> str:
    """Today's plain run: apply the example and print a line whenever the job or training changes."""
    custom = client.CustomObjectsApi(api)
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, job)
    name = job["metadata"]["name"]
    console.print(f"applied {EXAMPLE.relative_to(ROOT)}: ElasticJob {name}")
    progress = Path(job["spec"]["checkpointDir"]) / "progress.jsonl"
    shown, deadline = "", time.monotonic() + BASIC_TIMEOUT
    while time.monotonic() < deadline:
        snap = liveview.observe(api, NAMESPACE, name, progress)
        line = f"{liveview.plain_line(snap)}  {snap.status.get('message') or ''}"
        if line != shown:
            console.print(f"[{time.strftime('%H:%M:%S')}] {line}", highlight=False, markup=False, soft_wrap=True)
            shown = line
        if snap.phase in ("Succeeded", "Failed"):
            return snap.phase
        time.sleep(1)
    raise SystemExit(f"{name} did not finish within {BASIC_TIMEOUT}s")


def story(api: client.ApiClient, kubeconfig: Path, job: dict, console: Console) -> str:
    view = liveview.View(f"{NAMESPACE}/{job['metadata']['name']}", console)
    tale = Story(api, kubeconfig, EXAMPLE, job, view, ROOT / ".localcluster")
    try:
        with view:
            phase = tale.run()
    except StoryError as err:
        console.print(f"\nthe story stopped: {err}", highlight=False, markup=False)
        phase = "Failed"
    view.final_frame()
    console.print()
    console.print(summary(tale.faults))
    return phase


def explain(api: client.ApiClient, console: Console) -> None:
    """What was seen wrong, so that a run that stopped short names the pod behind it."""
    try:
        lines = diagnose.report(api)
    except ApiException as err:
        lines = [f"could not list the cluster's pods to say why: {err.status} {err.reason}"]
    console.print("\n" + ("\n".join(lines) if lines else "no pod is crash-looping or unschedulable"),
                  highlight=False, markup=False)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m localcluster.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["story", "basic"], default="story")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, 120))  # a log has no width to fit
    began = time.monotonic()
    cluster = controlplane.ensure_up(ROOT, 3, node_kind="real")
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["template"]["spec"]["containers"][0]["image"] = WORKER_IMAGE
    started = time.monotonic()
    try:
        install_operator(console, cluster.kubeconfig, api)
        clear_previous(client.CustomObjectsApi(api), job, console)
        examplescript.apply(api, NAMESPACE)  # the example mounts the script from it, as README says to make it
        started = time.monotonic()
        phase = basic(api, job, console) if args.scenario == "basic" else story(api, cluster.kubeconfig, job, console)
    except SystemExit as stop:
        console.print(str(stop), highlight=False, markup=False)
        phase = "stopped short"
    if phase != "Succeeded":
        explain(api, console)
    console.print(f"\n{job['metadata']['name']} {phase}: the job took {time.monotonic() - started:.0f}s, "
                  f"`make run` {time.monotonic() - began:.0f}s. The cluster and the operator keep running: "
                  f"`export KUBECONFIG={cluster.kubeconfig}` and `kubectl get ej`; `make cluster-down` stops it.",
                  highlight=False, markup=False)
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
