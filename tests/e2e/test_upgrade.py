"""Upgrade without losing a job (issue 32): the chart and operator of an earlier commit installed from the local
registry, a job training under it, then the steps docs/operations.md gives users, while the job trains: the
current CRD applied server-side, `helm upgrade` to the current chart. The job must not notice: the same worker
and store pods train on, nothing is charged (restarts, infrastructure failures, failure records, store restarts),
the rendezvous key Secret is the same bytes, the new operator's Deployment has rolled out (two replicas, one of
them holding the Lease) and took the job over, and the job reaches Succeeded.

The earlier commit is ELASTICJOB_UPGRADE_FROM or localcluster/previous.py's DEFAULT_FROM (the last commit before
the Lease: kopf peering, one replica, Recreate). Its operator image is built from that commit with imagebuild
(buildah, as root) and pushed once per commit, its chart published as `<version>-g<sha7>`
(`python -m localcluster.previous` does the same ahead of the run). Its chart has no jobImagePullSecrets, so the
job's template names the pull secret itself, as a user of that chart did.

The same scenario from one release to the next, each made by `make release VERSION=0.0.1-e2e.N REGISTRY=local`
(the path README gives users, into the local registry), the first installed from oci:// by its version. Both are
of the current tree, so this proves the release and the upgrade's mechanics, the earlier commit the code's.

Real nodes and the local registry only. Slow: the first run builds the images (a few minutes); then about 6
minutes each.
"""

from __future__ import annotations

import secrets
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_support import PULL_SECRETS, Jobs, Progress, job_manifest, story, summary, train_args
from helpers import wait_for

# The first run builds the earlier operator image (a few minutes) before the scenario's 6 or so: past pytest's
# 900 s default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
# 4 minutes of training at 2 steps a second: the CRD step, the upgrade and the rollout land in its middle.
STEPS, STEP_SECONDS = 480, 0.5
START_TIMEOUT = 180  # the earlier operator image's first pull on each node, then torch's start
ROLLOUT_TIMEOUT = 180  # the current image's pulls (cached on the nodes by earlier tests) and the Lease
FINISH_TIMEOUT = STEPS * STEP_SECONDS + 240


@pytest.fixture
def earlier(cluster, real_nodes) -> Any:
    """The earlier commit's image and chart in the local registry (built and pushed where they are not yet)."""
    if not cluster.pulls_from_registry:
        pytest.skip("needs the local registry: the earlier operator runs from its image")
    from localcluster import previous

    return previous.prepare_in_child()


@pytest.fixture
def release_name(cluster, kube, namespace) -> Iterator[str]:
    """The release's name; at the end it is uninstalled, the current CRDs are applied again (whatever step the
    test stopped at, the session's other tests get the current schema), and CRDs that an earlier chart brought and
    the current one does not have (kopf's peering), which Helm keeps, are deleted."""
    import helm_python as helm

    from localcluster import operatorchart

    ext = client.ApiextensionsV1Api(kube)
    before = {crd.metadata.name for crd in ext.list_custom_resource_definition().items}
    name = f"ej-{secrets.token_hex(3)}"
    yield name
    with helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=namespace) as cfg:
        cfg.uninstall(name, ignore_not_found=True)
    operatorchart.apply_crds(cluster.kubeconfig)
    current = {doc["metadata"]["name"] for doc in operatorchart.chart_crds()}
    for crd in {c.metadata.name for c in ext.list_custom_resource_definition().items} - before - current:
        try:
            ext.delete_custom_resource_definition(crd)
        except ApiException as err:
            if err.status != 404:
                raise


def established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = ext.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


def charged(status: dict) -> dict[str, int]:
    """Everything an operator charges a job for."""
    return {"restarts": status.get("restarts") or 0,
            "infrastructureFailures": status.get("infrastructureFailures") or 0,
            "lastFailures": len(status.get("lastFailures") or []),
            "rendezvous.restarts": (status.get("rendezvous") or {}).get("restarts") or 0}


def pod_uids(jobs: Jobs) -> dict[str, str]:
    """The job's worker and store pods, name -> uid."""
    pods = jobs.core.list_namespaced_pod(jobs.namespace, label_selector="elasticjob.dev/job-name=train").items
    return {p.metadata.name: p.metadata.uid for p in pods}


def steps_after(progress, when: float, count: int = 5) -> Progress:
    return wait_for(progress, 60, f"{count} training steps after {time.strftime('%H:%M:%S', time.localtime(when))}",
                    until=lambda p: len({r["step"] for r in p.after(when)}) >= count)


def rolled_out(apps: client.AppsV1Api, core: client.CoreV1Api, release, image: str) -> list[client.V1Pod]:
    """The Deployment's pods once the rollout is over: as many as it wants, all of the new template and image,
    none of the earlier one left (being deleted counts as left)."""
    from localcluster import operatorchart

    deployment = apps.read_namespaced_deployment(release.fullname, release.namespace)
    status, wanted = deployment.status, deployment.spec.replicas
    pods = operatorchart.operator_pods(core, release)
    every = core.list_namespaced_pod(release.namespace, label_selector=release.selector).items
    done = ((status.observed_generation or 0) >= deployment.metadata.generation
            and status.replicas == status.updated_replicas == status.ready_replicas == wanted
            and len(every) == wanted and all(p.spec.containers[0].image == image for p in pods)
            and all(p.status.phase == "Running" for p in pods))
    return pods if done else []


@dataclass(frozen=True)
class Installed:
    """What the scenario upgrades from: a chart in the local registry, the chart directory whose crds/ it brings,
    the operator image it runs, and its values."""

    chart: Any  # operatorchart.Published
    crds: Path
    image: str
    values: dict[str, Any]


def test_helm_upgrade_from_an_earlier_commit_while_a_job_trains(cluster, kube, jobs, progress, earlier,
                                                                release_name):
    from chart_operator import published_chart
    from localcluster import previous, registry

    current = published_chart()
    assert current is not None and current.version != earlier.chart.version
    upgrade_under_training(cluster, kube, jobs, progress, release_name,
                           Installed(earlier.chart, earlier.crds, earlier.image, previous.chart_values(jobs.namespace)),
                           current, registry.image("elasticjob-operator"))


def test_make_release_twice_then_helm_upgrade_from_the_first_to_the_second_while_a_job_trains(
        cluster, kube, jobs, progress, released, release_name):
    """The path README gives users: `make release` (here REGISTRY=local, the local cluster's registry) of two
    versions, the first installed from oci:// by its version, a job started, `helm upgrade` to the second."""
    from localcluster import operatorchart

    (first, first_image), (second, second_image) = released
    # The released chart's repository is the registry's (registry_values names the same), its digest its own.
    values = {"watch": {"allNamespaces": False, "namespaces": [jobs.namespace]}, **operatorchart.registry_values()}
    upgrade_under_training(cluster, kube, jobs, progress, release_name,
                           Installed(first, operatorchart.CHART, first_image, values), second, second_image)


def make_release(version: str) -> tuple[Any, str]:
    """`make release VERSION=version REGISTRY=local`, as a user runs it: (the chart it pushed, the operator image
    the chart pins)."""
    from localcluster import operatorchart, registry

    done = subprocess.run(["make", "--no-print-directory", "release", f"VERSION={version}", "REGISTRY=local"],
                          cwd=operatorchart.ROOT, stdout=subprocess.PIPE, text=True)
    assert done.returncode == 0, f"make release VERSION={version} failed (exit {done.returncode}): {done.stdout}"
    pushed = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("pushed ")]
    pinned = next(p for p in pushed if p.startswith("oci://"))
    ref_version, digest = pinned.rsplit("@", 1)
    ref, chart_version = ref_version.rsplit(":", 1)
    image = next(p for p in pushed if p.startswith(f"{registry.REPOSITORY}/elasticjob-operator:{version}@"))
    return operatorchart.Published(ref, chart_version, digest), image


@pytest.fixture
def released(cluster, real_nodes) -> list[tuple[Any, str]]:
    if not cluster.pulls_from_registry:
        pytest.skip("needs the local registry: `make release REGISTRY=local` pushes there")
    # Fixed versions: the images are built once (imagebuild's cache is by tag and content) and pushed once.
    return [make_release(f"0.0.1-e2e.{n}") for n in (1, 2)]


def upgrade_under_training(cluster, kube, jobs, progress, release_name: str, old: Installed, new: Any,
                           new_image: str) -> None:
    """`old` installed, a job trained under it, the CRDs applied and `helm upgrade` to `new` while it trains; the
    job must not notice."""
    from localcluster import operatorchart

    core, apps, ext = jobs.core, client.AppsV1Api(kube), client.ApiextensionsV1Api(kube)
    coordination = client.CoordinationV1Api(kube)
    ns = jobs.namespace

    # --- the earlier chart, its CRDs with it, as its users installed it -------------------------------------
    installed = operatorchart.install_or_upgrade(cluster.kubeconfig, old.values, release=release_name,
                                                 namespace=ns, chart=old.chart, crds=old.crds)
    assert installed.installed
    wait_for(lambda: established(ext, "elasticjobs.elasticjob.dev"), 30, "the earlier ElasticJob CRD Established")
    # Every replica its chart asks for (the earlier commit's one, a release of the current chart's two), running
    # its image.
    old_pods = wait_for(lambda: rolled_out(apps, core, installed, old.image), ROLLOUT_TIMEOUT,
                        f"the earlier operator running: its replicas, of image {old.image}")

    manifest = job_manifest(ns, train_args=train_args(STEPS, step_seconds=STEP_SECONDS))
    # An earlier operator may have no --image-pull-secret: its job pods (the store takes the template's) pull the
    # kit and the worker image with the template's secrets.
    manifest["spec"]["template"]["spec"]["imagePullSecrets"] = PULL_SECRETS
    jobs.create(manifest)
    wait_for(progress, START_TIMEOUT, "training at world size 2 under the earlier operator",
             until=lambda p: any(r["world_size"] == 2 for r in p.records))
    jobs.wait_phase("Running", 30)
    pods = pod_uids(jobs)
    assert len(pods) == 3, f"two workers and a store expected: {pods}"
    key_secret = f"{installed.fullname}-rendezvous-key"
    key = core.read_namespaced_secret(key_secret, ns).data
    before = jobs.status()
    charges = charged(before)

    # --- docs/operations.md, "Upgrading": the CRD first (Helm never upgrades crds/), then helm upgrade ---------
    operatorchart.apply_crds(cluster.kubeconfig)  # kubectl apply --server-side --force-conflicts -f crds/
    wait_for(lambda: established(ext, "elasticjobs.elasticjob.dev"), 30, "the current ElasticJob CRD Established")
    upgrade_at = time.time()
    upgraded = operatorchart.install_or_upgrade(
        cluster.kubeconfig, {"watch": {"allNamespaces": False, "namespaces": [ns]}, **operatorchart.registry_values()},
        release=release_name, namespace=ns, chart=new)
    assert not upgraded.installed and upgraded.revision == 2
    new_pods = wait_for(lambda: rolled_out(apps, core, upgraded, new_image), ROLLOUT_TIMEOUT,
                        "the new operator rolled out: 2 replicas of its image, the earlier pod gone")
    assert len(new_pods) == 2 and not {p.metadata.name for p in old_pods} & {p.metadata.name for p in new_pods}
    names = {p.metadata.name for p in new_pods}
    lease = wait_for(lambda: coordination.read_namespaced_lease(upgraded.fullname, ns), 60,
                     f"a new operator pod ({sorted(names)}) holding the Lease", ignore=(ApiException,),
                     until=lambda found: any(n in (found.spec.holder_identity or "") for n in names))
    rolled_at = time.time()
    # The new operator took the job over: status.goodput is the current operator's (the earlier one never wrote
    # it; with a later ELASTICJOB_UPGRADE_FROM it may have).
    wait_for(jobs.status, 60, "the new operator's first status write (status.goodput)",
             until=lambda s: s.get("goodput") is not None)

    # --- the job did not notice --------------------------------------------------------------------------------
    steps_after(progress, rolled_at)
    assert pod_uids(jobs) == pods, "a worker or the store was replaced by the upgrade"
    after = jobs.status()
    assert charged(after) == charges, f"the upgrade was charged: {summary(before)} -> {summary(after)}"
    assert core.read_namespaced_secret(key_secret, ns).data == key, "helm upgrade changed the rendezvous key"

    done = jobs.wait_phase("Succeeded", FINISH_TIMEOUT)
    assert charged(done) == charges, summary(done)
    workers = {p.metadata.name: p.metadata.uid for p in jobs.worker_pods()}
    assert workers == {n: u for n, u in pods.items() if n in workers} and len(workers) == 2, (
        f"a worker was replaced after the upgrade: {pods} -> {workers}\n{story(jobs)}")
    trained = progress()
    missing = set(range(1, STEPS + 1)) - {r["step"] for r in trained.records}
    assert trained.last_step == STEPS and not missing, f"steps never done: {sorted(missing)[:20]}; {trained}"
    started = min(r["time"] for r in trained.records)
    print(f"\nupgraded {old.chart.version} -> {new.version} at +{upgrade_at - started:.0f}s of training; "
          f"rolled out in {rolled_at - upgrade_at:.1f}s; Lease held by {lease.spec.holder_identity}")
