"""The taint of a node that stays bad, on the node's side (--taint-bad-nodes): the patch bodies
(elasticjob/taints.py), and the controller writing them (controller/node_taints.py, apply.py) against a fake API
server with the real one's merge-patch and resourceVersion semantics: a Conflict read again, a node gone, a
refusal (403) shown once on the job, and the sweep that removes what no job untainted."""

from __future__ import annotations

import asyncio
import copy
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import factory
import pytest
from kubernetes.client import ApiClient, Configuration

from elasticjob import k8s, planner, rest, taints
from elasticjob.controller import node_taints
from elasticjob.controller.apply import Applied, apply, refused_taints, remember_applied, unapplied
from elasticjob.controller.context import Context, JobMemory
from elasticjob.controller.mirror import Mirror
from elasticjob.domain import Settings
from elasticjob.naming import UNHEALTHY_TAINT as KEY
from elasticjob.naming import UNHEALTHY_UNTIL_ANNOTATION as UNTIL
from elasticjob.rendezvous_client import StoreClient

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
T = {n: (NOW + timedelta(minutes=n)).strftime("%Y-%m-%dT%H:%M:%SZ") for n in range(-10, 21)}
JUST_AFTER = "2026-01-01T12:10:01Z"  # a second past T[10]
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
REF = factory.job().ref
LOG = logging.LoggerAdapter(logging.getLogger("test"), {})


def node(taints_: list[dict[str, Any]] | None = None, until: str | None = None, label: str | None = None,
         rv: str = "5") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "node-a", "resourceVersion": rv, "labels": {"kubernetes.io/hostname": "node-a"}}
    if until is not None:
        meta["annotations"] = {UNTIL: until}
    if label is not None:
        meta["labels"][KEY] = label
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {"taints": taints_ or []}}


def ours(reason: str = "WorkerFailed") -> dict[str, str]:
    return {"key": KEY, "value": reason, "effect": "NoSchedule"}


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


# --- the patch bodies -------------------------------------------------------------------------------------------


def test_a_clean_node_gets_the_taint_its_label_and_its_end_in_one_patch_beside_its_other_taints():
    patch = taints.taint_patch(node([GPU]), "WorkerFailed", T[10])
    assert patch == {"metadata": {"resourceVersion": "5", "labels": {KEY: "WorkerFailed"},
                                  "annotations": {UNTIL: T[10]}},
                     "spec": {"taints": [GPU, ours()]}}


@pytest.mark.parametrize("written, reason, changed", [
    (T[5], "Partitioned", True),  # an earlier end of ours: the later one and its reason replace it
    (T[10], "Partitioned", False),  # the same end: nothing to write, the first reason kept
    (T[20], "Partitioned", False),  # a later end (another job's): kept, with its reason
])
def test_a_node_tainted_by_us_moves_only_later(written, reason, changed):
    before = node([ours(), GPU], until=written, label="WorkerFailed")
    patch = taints.taint_patch(before, reason, T[10])
    if not changed:
        assert patch is None
        return
    after = merge(before, patch)
    assert after["spec"]["taints"] == [ours(reason), GPU]  # in place, the others untouched
    assert after["metadata"]["annotations"] == {UNTIL: T[10]} and after["metadata"]["labels"][KEY] == reason


def test_a_taint_of_that_key_someone_else_set_is_theirs():
    """No annotation of ours: an administrator's `kubectl taint`; neither changed nor removed."""
    theirs = node([{"key": KEY, "effect": "NoExecute"}])
    assert taints.taint_patch(theirs, "WorkerFailed", T[10]) is None
    assert taints.untaint_patch(theirs, NOW) is None


def test_a_taint_removed_by_hand_stays_removed_for_the_ends_already_written():
    by_hand = node([GPU], until=T[10], label="WorkerFailed")
    assert taints.taint_patch(by_hand, "WorkerFailed", T[10]) is None, "a replay after a restart"
    again = merge(by_hand, taints.taint_patch(by_hand, "Partitioned", JUST_AFTER))
    assert again["spec"]["taints"] == [GPU, ours("Partitioned")], "a later avoidance taints it again"


def test_an_unreadable_end_is_left_alone():
    garbled = node([ours()], until="soon", label="WorkerFailed")
    assert taints.taint_patch(garbled, "WorkerFailed", T[10]) is None
    assert taints.untaint_patch(garbled, NOW) is None


@pytest.mark.parametrize("written, removed", [(T[-1], True), (T[0], True), (T[1], False)])
def test_the_taint_goes_once_its_end_is_past(written, removed):
    before = node([GPU, ours()], until=written, label="WorkerFailed")
    patch = taints.untaint_patch(before, NOW)
    if not removed:
        assert patch is None
        return
    after = merge(before, patch)
    assert after["spec"]["taints"] == [GPU]
    assert KEY not in after["metadata"]["labels"] and UNTIL not in after["metadata"].get("annotations", {})
    assert patch["metadata"]["resourceVersion"] == "5"


def test_a_past_end_without_its_taint_loses_its_label_and_annotation_and_no_one_elses_taint():
    before = node([GPU], until=T[-1], label="WorkerFailed")
    patch = taints.untaint_patch(before, NOW)
    assert "spec" not in patch and merge(before, patch)["spec"]["taints"] == [GPU]
    assert KEY not in merge(before, patch)["metadata"]["labels"]


# --- the client and the controller ---------------------------------------------------------------------------


class Server(k8s.Kube):
    """The API server's side of the node calls: a merge patch under a resourceVersion precondition."""

    def __init__(self, stored: dict[str, Any] | None) -> None:
        super().__init__(ApiClient(Configuration()))
        self.node, self.patches, self.events = stored, [], []
        self.refuse: k8s.KubeError | None = None
        self.races = 0  # patches that find the node changed since it was read (a kubelet's status update)

    async def get_node(self, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.node)

    async def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        found = self.node is not None and label_selector in self.node["metadata"].get("labels", {})
        return [copy.deepcopy(self.node)] if found else []

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        if self.refuse is not None:
            raise self.refuse
        if self.node is None:
            raise k8s.NotFound(404, "NotFound", f'nodes "{name}" not found')
        if self.races:
            self.races -= 1
            self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
        if patch["metadata"].get("resourceVersion") != self.node["metadata"]["resourceVersion"]:
            raise k8s.Conflict(409, "Conflict", "the object has been modified")
        self.patches.append(patch)
        self.node = merge(self.node, patch)
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.node)

    async def post_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def context(server: Server) -> Context:
    return Context(kube=server, mirror=Mirror(), stores=StoreClient(b"k" * 32),
                   settings=Settings(taint_bad_nodes=True), logger=logging.getLogger("test"), instance="t")


TAINT = planner.TaintNode("node-a", "WorkerFailed", T[10], event=planner.Event("Normal", "NodeTainted", "m"))
UNTAINT = planner.UntaintNode("node-a", event=planner.Event("Normal", "NodeUntainted", "m"))


def run(server: Server, *actions: planner.Action) -> tuple[Applied, list[planner.Event]]:
    outbox: list[planner.Event] = []
    return asyncio.run(apply(context(server), REF, list(actions), outbox, LOG)), outbox


def test_the_client_sends_a_merge_patch_of_the_node():
    sent = []

    class Recorder(k8s.Kube):
        async def _send(self, method: str, url_path: str, **kwargs: Any) -> Any:
            sent.append((method, url_path, kwargs))
            raise k8s.NotFound(404, "NotFound", "gone")

    kube = Recorder(ApiClient(Configuration()))
    patch = {"metadata": {"resourceVersion": "5"}}
    with pytest.raises(k8s.NotFound):
        asyncio.run(kube.patch_node("node-a", patch))
    assert sent == [("PATCH", "/api/v1/nodes/node-a", {"body": patch, "content_type": rest.MERGE_PATCH})]
    assert asyncio.run(kube.get_node("node-a")) is None  # gone: None, as for the other reads
    with pytest.raises(k8s.NotFound):
        asyncio.run(kube.list_nodes(KEY))
    assert sent[-1] == ("GET", "/api/v1/nodes", {"query": {"labelSelector": KEY}})


def test_a_taint_is_written_and_its_event_posted_once():
    server = Server(node([GPU]))
    applied, outbox = run(server, TAINT)
    assert server.node["spec"]["taints"] == [GPU, ours()] and server.node["metadata"]["annotations"] == {UNTIL: T[10]}
    assert [e.reason for e in outbox] == ["NodeTainted"] and applied.taint_refused is None
    applied, outbox = run(server, TAINT)  # again (the controller's memory lost: a restart): nothing to write
    assert len(server.patches) == 1 and outbox == []


def test_a_node_that_changed_since_it_was_read_is_read_again():
    server = Server(node([GPU]))
    server.races = 2
    run(server, TAINT)
    assert server.node["spec"]["taints"] == [GPU, ours()]


def test_a_node_that_keeps_changing_fails_the_reconcile_not_as_the_jobs_conflict():
    """A Conflict would read the job again as a lost status race (reconcile.py): the loop's backoff instead."""
    server = Server(node([GPU]))
    server.races = node_taints.CONFLICT_RETRIES
    with pytest.raises(k8s.KubeError) as raised:
        run(server, TAINT)
    assert not isinstance(raised.value, k8s.Conflict) and "node-a" in str(raised.value)


@pytest.mark.parametrize("stored", [None, node([GPU])], ids=["gone before the read", "gone before the patch"])
def test_a_node_gone_is_nothing_to_do(stored):
    server = Server(stored)
    if stored is not None:
        server.refuse = k8s.NotFound(404, "NotFound", 'nodes "node-a" not found')
    applied, outbox = run(server, TAINT, UNTAINT)
    assert outbox == [] and applied.refusal is None and applied.taint_refused is None


def test_a_refused_taint_is_said_once_on_the_job_which_goes_on_by_itself():
    server = Server(node([GPU]))
    server.refuse = k8s.Forbidden(403, "Forbidden", 'nodes "node-a" is forbidden: User cannot patch resource')
    applied, outbox = run(server, TAINT)
    assert applied.refusal is None, "not the job's own objects: nothing waits, no FailedCreate"
    assert "forbidden" in (applied.taint_refused or "") and outbox == []
    memory = JobMemory()
    (event,) = refused_taints(memory, applied)
    assert (event.type, event.reason) == ("Warning", "NodeTaintRefused") and "forbidden" in event.message
    assert refused_taints(memory, applied) == [], "once per job"
    # Remembered as sent: the next plans do not ask again for the same node and end.
    remember_applied(memory.applied, [TAINT])
    assert unapplied(memory.applied, [TAINT]) == []


def test_only_a_changed_taint_is_sent_again():
    memory = JobMemory()
    remember_applied(memory.applied, [TAINT])
    later = planner.TaintNode("node-a", "WorkerFailed", JUST_AFTER)
    assert unapplied(memory.applied, [TAINT, later]) == [later]
    remember_applied(memory.applied, [UNTAINT])
    assert unapplied(memory.applied, [TAINT]) == [TAINT], "forgotten once untainted: a new avoidance taints again"


def test_an_untaint_removes_only_what_is_past():
    """On the controller's clock, as the planner's."""
    def from_now(seconds: int) -> str:
        return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")
    server = Server(node([ours(), GPU], until=from_now(-1), label="WorkerFailed"))
    _, outbox = run(server, UNTAINT)
    assert server.node["spec"]["taints"] == [GPU] and [e.reason for e in outbox] == ["NodeUntainted"]
    later = Server(node([ours(), GPU], until=from_now(600), label="WorkerFailed"))  # another job's, until then
    _, outbox = run(later, UNTAINT)
    assert later.patches == [] and outbox == []


def test_the_sweep_removes_what_no_job_untainted():
    """A job deleted (or finished, or its avoidNodeSeconds lowered) before its taint's end: none untaints it."""
    past = Server(node([ours(), GPU], until=T[-1], label="WorkerFailed"))
    assert asyncio.run(node_taints.sweep(past, NOW)) == ["node-a"] and past.node["spec"]["taints"] == [GPU]
    running = Server(node([ours()], until=T[1], label="WorkerFailed"))
    assert asyncio.run(node_taints.sweep(running, NOW)) == [] and running.patches == []
    theirs = Server(node([{"key": KEY, "effect": "NoSchedule"}], label="x"))  # labelled, with no end of ours
    assert asyncio.run(node_taints.sweep(theirs, NOW)) == [] and theirs.patches == []


def test_the_sweep_runs_on_the_leader_alone_and_says_a_refusal_once(caplog):
    server = Server(node([ours()], until="2020-01-01T00:00:00Z", label="WorkerFailed"))
    ctx = context(server)
    ctx.gate.active = False

    async def sweeps() -> None:
        """Sweeps for 50 ms, one a millisecond."""
        task = asyncio.ensure_future(node_taints.sweep_forever(ctx, every=0.001))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(sweeps())
    assert server.patches == [], "a replica that is not the leader writes nothing"
    ctx.gate.active = True
    server.refuse = k8s.Forbidden(403, "Forbidden", "cannot patch nodes")
    with caplog.at_level(logging.WARNING, "test"):
        asyncio.run(sweeps())
    assert len([r for r in caplog.records if "badNodes.taint" in r.getMessage()]) == 1
    server.refuse = None
    asyncio.run(sweeps())
    assert server.node["spec"]["taints"] == [] and len(server.patches) == 1
