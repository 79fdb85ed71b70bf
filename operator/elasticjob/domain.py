"""The operator's own types, used by every layer above the models: a job as the builders and the planner see it
(JobRef), how this installation builds objects (Settings), and where a pod must go (Placement)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from elasticjob.models import ElasticJobSpec


@dataclass(frozen=True)
class Settings:
    """How this operator installation builds objects (from its command line)."""

    network_policy: bool = True
    # Each store's port answers only its job's pods (elasticjob_store/gate.py); off where the network rewrites
    # the pods' source addresses (--no-store-peer-check).
    store_peer_check: bool = True
    # Drive each job's rendezvous on evidence (planner/recovery.py); off: torch's own timing alone.
    nudges: bool = True
    # Who may reach the store's control port besides the job's pods: the operator's pods.
    operator_namespace: str | None = None
    operator_labels: tuple[tuple[str, str], ...] = (("app.kubernetes.io/name", "elasticjob-operator"),)
    # The image the kit (elasticjob_kit) is copied from into every job pod: the operator's own. None: no kit;
    # the store then needs elasticjob_store in the worker image, and no job gets warm starts.
    kit_image: str | None = None
    # Secrets (names, in the job's namespace) every job pod gets in imagePullSecrets besides its template's: the
    # kit's image (the operator's) and the workers' may need credentials the job's author does not hold.
    image_pull_secrets: tuple[str, ...] = ()
    # A node a job avoids for a reason of the node's own is also tainted for every pod (elasticjob.dev/unhealthy,
    # NoSchedule) until the last such avoidance ends (--taint-bad-nodes; needs patch and list on nodes).
    taint_bad_nodes: bool = False
    # Each integration's own settings (its flags: elasticjob/integrations.py), by its name; the core reads none.
    integrations: tuple[tuple[str, Any], ...] = ()

    def integration(self, name: str) -> Any:
        """The integration's settings, or None where it has none here (its defaults then)."""
        return next((value for key, value in self.integrations if key == name), None)

    def with_integration(self, name: str, value: Any) -> Settings:
        kept = tuple((key, old) for key, old in self.integrations if key != name)
        return dataclasses.replace(self, integrations=(*kept, (name, value)))


@dataclass(frozen=True)
class Placement:
    """What a pod gets beyond its template to be scheduled as the job must: membership in a gang
    (gang/podgroup.py), Kueue's resource flavor (kueue/workloads.py)."""

    labels: tuple[tuple[str, str], ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[dict[str, Any], ...] = ()
    scheduler_name: str | None = None
    scheduling_group: str | None = None  # spec.schedulingGroup.podGroupName (the Workload API)
    avoid_nodes: tuple[str, ...] = ()  # nodes the pod must not land on (planner/nodes.py)

    def merge(self, other: Placement) -> Placement:
        return Placement(self.labels + other.labels, self.node_selector + other.node_selector,
                         self.tolerations + other.tolerations, other.scheduler_name or self.scheduler_name,
                         other.scheduling_group or self.scheduling_group,
                         tuple(dict.fromkeys(self.avoid_nodes + other.avoid_nodes)))


NO_PLACEMENT = Placement()


@dataclass(frozen=True)
class JobRef:
    """What every owned object needs to know about its job."""

    namespace: str
    name: str
    uid: str
    spec: ElasticJobSpec
    labels: tuple[tuple[str, str], ...] = ()  # the job's own (Kueue's queue-name and priority-class)

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key) or None
