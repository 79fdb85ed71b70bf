"""The job's rendezvous: its Service and the one endpoint behind it, the store pod (its token's digest in its
spec), the namespace's NetworkPolicies around the stores and the workers, and whether the store serves. Pure."""

from __future__ import annotations

from datetime import datetime

from elasticjob import builders, naming
from elasticjob.domain import NO_PLACEMENT, Placement, Settings
from elasticjob.observe import PodView, ServiceView
from elasticjob.planner import ownership
from elasticjob.planner.base import (
    ApplyObject,
    CreateObject,
    DeleteObject,
    DeletePod,
    DeleteService,
    Event,
    Job,
    Observed,
    Plan,
    precise,
    set_condition,
)


def ensure_rendezvous(plan: Plan, job: Job, observed: Observed, settings: Settings, token: str,
                      now: datetime, placement: Placement = NO_PLACEMENT) -> None:
    status = plan.status.rendezvous
    store = observed.store_pod
    usual = naming.rendezvous_name(job.ref.name)
    status.pod = store.name if store else ownership.pod_name(usual, job.ref.uid, observed.taken, plan.status)
    service = ensure_service(plan, job, observed, settings, token)
    route(plan, job, store, service)
    evict_foreign_endpoints(plan, job, observed, service)
    if store is None:
        store_manifest = builders.rendezvous_pod(job.ref, placement, token, settings.kit_image,
                                                 settings.image_pull_secrets, settings.store_peer_check)
        store_manifest["metadata"]["name"] = status.pod
        plan.act(CreateObject(ownership.sign(store_manifest, plan.status, token)))
    elif store.phase in ("Failed", "Succeeded") and not store.deleting:
        plan.act(DeletePod(store.name, store.uid, grace_seconds=0))
    elif store.killed_and_backed_off and not store.deleting:
        # The kubelet's back-off doubles with each kill, up to 5 minutes without a store; a new pod has none.
        # Only after a signal: a store that cannot start keeps the kubelet's back-off, not a loop of new pods.
        plan.act(DeletePod(store.name, store.uid, grace_seconds=0, event=Event(
            "Warning", "RendezvousRecreated", f"rendezvous pod {store.name} was killed again and the kubelet holds "
            f"it back (CrashLoopBackOff); deleted it, a new one starts at once at the same endpoint")))
    serving = store is not None and store.serving
    if status.ready and not serving:
        status.restarts += 1
        status.last_lost_time = precise(now)  # the ledger compares it with the training's steps
        plan.warn("RendezvousLost", f"rendezvous pod {status.pod} stopped serving; bringing it back at the same "
                                    f"endpoint {status.endpoint}, where the agents take their round")
    status.ready = serving
    set_condition(plan.status, "RendezvousReady", serving, "StoreReady" if serving else "StoreNotReady",
                  f"c10d store at {status.endpoint}" if serving else "waiting for the rendezvous pod",
                  now, job.generation)


def ensure_service(plan: Plan, job: Job, observed: Observed, settings: Settings, token: str) -> ServiceView | None:
    """The job's Service, made when missing; one of its name that the operator did not make is deleted first
    (made again once it is gone), never adopted."""
    status, service = plan.status.rendezvous, observed.service
    name = naming.rendezvous_service_name(job.ref.name, plan.status.renamed)
    if service is not None:
        if plan.status.owned_pods is not None:
            status.service_uid, status.service_serial = service.uid, max(status.service_serial, service.serial)
        if service.cluster_ip:
            status.endpoint = f"{service.cluster_ip}:{job.ref.spec.rendezvous.port}"
        return service
    rejected = observed.rejected_service
    if rejected is not None:
        plan.act(DeleteService(rejected.name, rejected.uid))
        why = "routes by a selector" if rejected.selector else f"is not the one it made (uid {status.service_uid})"
        plan.warn("ServiceReplaced", f"Service {rejected.name} (uid {rejected.uid}) names this job as its owner but "
                                     f"{why}: deleted it; the operator makes its own again")
        return None
    # Every job gets one at its start; an Event says so only when it was lost and is made again.
    again = Event("Normal", "RendezvousCreated", f"created Service {name} again for the c10d "
                                                 f"rendezvous store (was {status.endpoint})")
    service_manifest = ownership.sign(builders.rendezvous_service(job.ref, name), plan.status, token)
    plan.act(CreateObject(service_manifest, again if status.endpoint else None))
    if settings.network_policy:
        plan.act(CreateObject(builders.network_policy(job.ref.namespace, settings), per_namespace=True))
        plan.act(CreateObject(builders.worker_network_policy(job.ref.namespace), per_namespace=True))
    return None


def evict_foreign_endpoints(plan: Plan, job: Job, observed: Observed, service: ServiceView | None) -> None:
    """The Service has no selector, so its endpoints are whatever EndpointSlices name it: the operator's one
    (route), and any other that anyone who may create EndpointSlices, or an Endpoints object the
    endpointslice-mirroring controller copies into one, adds; those would receive the agents' connections and
    the operator's token. Each is deleted, and the Endpoints object of the Service's name behind a mirrored one
    (an Endpoints of another name is not this job's to delete, whatever a slice claims)."""
    if plan.status.owned_pods is None or service is None:
        return  # a job started before pods were signed keeps its selector, and Kubernetes' own slices
    for found in observed.endpoint_slices:
        if found.name == service.name:
            continue  # the operator's own (route applies it, forced, whoever made it first)
        what = f"EndpointSlice {found.name}"
        source = found.mirrored_from if found.mirrored_from and found.mirrored_from[0] == service.name else None
        if source is not None:
            what = f"Endpoints {source[0]} (mirrored into EndpointSlice {found.name})"
        event = Event("Warning", "ForeignEndpoints", f"{what} added {', '.join(found.addresses) or 'no address'} "
                      f"to Service {service.name}, whose one endpoint is the store pod the operator made: deleted it")
        if source is not None:
            # The mirroring controller deletes its slice once the Endpoints is gone, often before the operator
            # does (a 404, which posts nothing): the Event goes with the Endpoints' deletion.
            plan.act(DeleteObject("v1", "Endpoints", "endpoints", source[0], source[1], event=event))
        plan.act(DeleteObject("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", found.name, found.uid,
                              event=None if source is not None else event))


def route(plan: Plan, job: Job, store: PodView | None, service: ServiceView | None) -> None:
    """The Service routes to the store pod the operator made, and to nothing else (a job started before the
    operator signed its pods keeps its Service's selector)."""
    if plan.status.owned_pods is None or service is None:
        return
    target = None
    if store is not None and store.ip and store.phase == "Running" and not store.deleting:
        target = (store.name, store.uid, store.ip)
    plan.act(ApplyObject(builders.rendezvous_endpoints(job.ref, target, service.name)))


def report_round(plan: Plan, observed: Observed) -> None:
    """torch's round and the nodes in it, as the store last reported them (kept when it cannot be read)."""
    store = observed.store
    if store is not None and store.round is not None:
        plan.status.rendezvous.round, plan.status.rendezvous.nodes = store.round, store.nodes
