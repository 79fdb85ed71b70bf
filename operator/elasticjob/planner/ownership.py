"""Which pods are the job's own: only those the operator made. Pure.

A controller ownerReference proves nothing: anyone who may create pods and read the job's uid can write one,
with the job's labels. So each pod the operator makes carries a serial (which making of its name it is) and a
mark, HMAC(the job's token, kind/name/serial); the token is HMAC(operator key, job uid), which no one else can
compute. The job's status records, per name, the current serial (written before the pod is created) and, once
seen, that pod's uid:
- a pod whose uid is recorded is the operator's, whatever key it was signed with (an operator started without
  a key file gets a new random key at every start);
- otherwise its mark must verify, for the recorded serial or a newer one: a copy of a real pod's annotations
  made after that pod was gone carries the recorded serial but another uid, or an older serial, and is refused;
- a pod of the recorded serial, not yet seen, signed under a key the operator no longer has, is taken on the
  record's word (only after a key change).
The records are in the job's status, so a restarted operator knows as much as the one before it. A uid rides
along with the next status write (the new pod's count brings one within seconds): no request of its own.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from elasticjob import naming
from elasticjob.models import ElasticJobStatus, OwnedPod
from elasticjob.observe import PodView, ServiceView
from elasticjob.planner.base import NameTaken, Plan


def mark(token: str, kind: str, name: str, serial: int) -> str:
    return hmac.new(token.encode(), f"{kind}/{name}/{serial}".encode(), hashlib.sha256).hexdigest()


def key_id(token: str) -> str:
    """A fingerprint of the key behind the token, safe to show."""
    return mark(token, "Key", "", 0)[:16]


def begin(status: ElasticJobStatus) -> None:
    """A job that has not started signs its pods from the start; a job started by an operator that did not sign
    (no records) keeps being trusted by its ownerReference until it ends or is suspended."""
    if status.owned_pods is None and status.start_time is None:
        status.owned_pods = []


def admit(pods: list[PodView], status: ElasticJobStatus, token: str) -> list[PodView]:
    """The pods, of those that name the job as their controller, that the operator made."""
    if status.owned_pods is None:
        return pods if status.start_time is not None else []
    records = {r.name: r for r in status.owned_pods}
    current = key_id(token)
    return [p for p in pods if _genuine(p, records.get(p.name), token, current)]


def _genuine(pod: PodView, record: OwnedPod | None, token: str, current_key: str) -> bool:
    if pod.serial is None:
        return False
    recorded, uid = (record.serial, record.uid) if record else (0, "")
    if uid and (pod.serial, pod.uid) == (recorded, uid):
        return True
    if hmac.compare_digest(pod.mark, mark(token, "Pod", pod.name, pod.serial)):
        return pod.serial > recorded or (pod.serial == recorded and not uid)
    return record is not None and record.key != current_key and pod.serial == recorded and not uid


def service_admitted(service: ServiceView | None, status: ElasticJobStatus, token: str) -> ServiceView | None:
    """The job's Service if the operator made it (a stranger's could route the agents, and the token, anywhere).
    As a pod's, its making has a serial, written before it is made, and its mark signs it; once seen its uid is
    recorded (with the next status write), and from then on only that Service counts. A copy of an earlier
    making's annotations carries an older serial and is refused. Until its uid is recorded, its mark vouches for
    it, or, after a key change, the job's records. One with a selector never counts: the operator's has none,
    and a selector routes to any pod labelled as the store."""
    if service is None or status.owned_pods is None:
        return service
    if service.selector:
        return None
    rendezvous = status.rendezvous
    if rendezvous.service_uid:
        return service if service.uid == rendezvous.service_uid else None
    if service.serial < rendezvous.service_serial:
        return None
    if hmac.compare_digest(service.mark, mark(token, "Service", service.name, service.serial)):
        return service
    current = key_id(token)
    changed = any(r.key != current for r in status.owned_pods)
    return service if changed and service.serial == rendezvous.service_serial else None


def record_seen(status: ElasticJobStatus, pods: list[PodView]) -> None:
    """Remember the uid of each admitted pod that is its name's newest making."""
    if status.owned_pods is None:
        return
    records = {r.name: r for r in status.owned_pods}
    for pod in pods:
        record = records.get(pod.name)
        if pod.serial is None or record is None:
            continue  # the record of a making is written before it is made
        if pod.serial > record.serial or (pod.serial == record.serial and not record.uid):
            record.serial, record.uid = pod.serial, pod.uid


def next_serial(serial: int, seen: bool) -> int:
    """The serial of an object's next making. One not yet seen keeps its number, so a create that is repeated
    asks for the same object (409: done); once a making was seen, the next one gets a new number."""
    return serial + 1 if seen or not serial else serial


def allocate(status: ElasticJobStatus, name: str, token: str) -> int | None:
    """The serial of the next making of pod `name` (next_serial), recorded. None for a job whose pods are not
    signed."""
    if status.owned_pods is None:
        return None
    record = next((r for r in status.owned_pods if r.name == name), None)
    if record is None:
        record = OwnedPod(name=name, serial=0)
        status.owned_pods.append(record)
    serial = next_serial(record.serial, seen=bool(record.uid))
    if serial != record.serial:
        record.serial, record.uid = serial, ""
    record.key = key_id(token)
    return record.serial


def pod_name(usual: str, uid: str, taken: frozenset[str], status: ElasticJobStatus) -> str:
    """The name to make a pod under: the usual one, unless a pod that is not the job's holds it (an earlier
    job's, still terminating), then its alternate; a making recorded but not yet seen keeps the name it was
    asked under, so a create that is repeated never makes a second pod. Either may have been renamed
    (rename_taken)."""
    usual = naming.in_use(status.renamed, "Pod", usual)
    alternate = naming.in_use(status.renamed, "Pod", naming.alternate_name(usual, uid))
    pending = {r.name for r in status.owned_pods or [] if not r.uid}
    if usual in pending or alternate in pending:
        return usual if usual in pending and usual not in taken else alternate
    return alternate if usual in taken else usual


def rename_taken(plan: Plan, job: str, squatted: tuple[NameTaken, ...]) -> None:
    """A name the operator asked for that an object it will never count as the job's holds (a pod or Service
    without the job's label: each create answered 409, which used to count as done, and the job waited in
    silence): the job's object is made under the usual name and the taken name's random suffix instead, recorded
    before it is made, so every later reconcile, and a restarted operator, asks for the same one."""
    renamed = plan.status.renamed or {}
    for taken in squatted:
        key = next((k for k, v in renamed.items() if v == taken.name and k.startswith(f"{taken.kind}/")),
                   naming.renamed_key(taken.kind, taken.name))
        usual = key.split("/", 1)[1]
        if naming.in_use(renamed, taken.kind, usual) != taken.name:
            continue  # renamed already
        renamed[key] = naming.with_suffix(usual, taken.suffix, job)
        if taken.kind == "Pod" and plan.status.owned_pods is not None:  # that making never happened
            plan.status.owned_pods = [r for r in plan.status.owned_pods if r.name != taken.name]
        plan.warn("NameTaken", f"{taken.kind} {taken.name} is held by an object that is not this job's (uid "
                               f"{taken.holder_uid}); the job's {taken.kind} is made as {renamed[key]} instead")
    plan.status.renamed = renamed or plan.status.renamed


def allocate_service(status: ElasticJobStatus) -> int | None:
    """The serial of the rendezvous Service's next making (next_serial), recorded."""
    if status.owned_pods is None:
        return None
    rendezvous = status.rendezvous
    serial = next_serial(rendezvous.service_serial, seen=bool(rendezvous.service_uid))
    if serial != rendezvous.service_serial:
        rendezvous.service_serial, rendezvous.service_uid = serial, None
    return serial


def sign(manifest: dict[str, Any], status: ElasticJobStatus, token: str) -> dict[str, Any]:
    """Number and mark a Pod or Service about to be created (in place)."""
    meta = manifest["metadata"]
    kind, name = manifest["kind"], meta["name"]
    serial = allocate(status, name, token) if kind == "Pod" else allocate_service(status)
    if serial is None or status.owned_pods is None:
        return manifest
    meta["annotations"] = {**(meta.get("annotations") or {}), naming.SERIAL_ANNOTATION: str(serial),
                           naming.MARK_ANNOTATION: mark(token, kind, name, serial)}
    return manifest
