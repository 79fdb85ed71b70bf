"""A slow link, from the round's verdict to the pod replaced: the store checks the verdict rank 0 wrote under the
round's prefix and turns its rank into an address (elasticjob_store/links.py), the operator parses the reply, and
the planner replaces that worker once, avoiding its node (planner/links.py). Table tests through planner.plan with
the orderings the controller sees: the same answer twice, a verdict of an older round, a lying verdict."""

from __future__ import annotations

import json

import pytest
from factory import NOW, job, observed, rdzv, running_status, store, worker

from elasticjob import planner, store_reply
from elasticjob.observe import LinksView
from elasticjob_store import links
from elasticjob_store.report import describe
from elasticjob_store.rounds import RoundTracker

SLOW = "node-slow"
ADDRS = {0: "10.244.0.10", 1: "10.244.0.11", 2: "10.244.0.12"}


def verdict(outlier: int | None = 1, world: int = 3, **fields) -> bytes:
    body = {"v": 1, "world": world, "seconds": 0.12, "outlier": outlier,
            "reason": "rank 1's best link: 3.1 MB/s" if outlier is not None else None,
            "bandwidthMBps": [900, 3, 880][:world], "latencyUs": [100, 5000, 110][:world], **fields}
    return json.dumps(body).encode()


def test_the_key_is_the_one_torchs_prefix_store_makes_for_the_round():
    import torch.distributed as dist

    from elasticjob_warm import linkprobe

    store = dist.HashStore()
    dist.PrefixStore("torch.rendezvous.run-1.7", store).set(linkprobe.REPORT_KEY, b"x")
    assert store.get(links.key("run-1", 7)) == b"x"


@pytest.mark.parametrize("raw, why", [
    (verdict(outlier=3), "a rank past the world"),
    (verdict(outlier=1, reason=None), "an outlier without a reason"),
    (verdict(outlier=None, reason="x"), "a reason without an outlier"),
    (verdict(bandwidthMBps=[1, 2]), "figures for fewer ranks than the world"),
    (verdict(latencyUs=[1, 2, -3]), "a negative figure"),
    (verdict(seconds=1e9), "a probe longer than an hour"),
    (verdict(v=2), "another version"),
    (verdict(extra=1), "an unknown field"),
    (b"[" * 100_000, "deep JSON"),
    (b"\xff", "not UTF-8"),
])
def test_the_store_refuses_a_verdict_with_any_field_wrong(raw, why):
    assert links.check(raw) is None, why


def test_the_store_reads_the_latest_rounds_verdict_once_and_names_the_outlier_by_its_address():
    reader = links.LinkReader()
    assert reader.wanted(7, 100.0, 100.5)
    reader.take(verdict(outlier=1), ADDRS)
    assert reader.describe() == {"round": 7, "world": 3, "seconds": 0.12, "outlier": ADDRS[1],
                                 "reason": "rank 1's best link: 3.1 MB/s"}
    assert not reader.wanted(7, 100.0, 101.0), "read once"
    assert reader.wanted(8, 200.0, 200.1) and reader.describe() is None, "a new round drops the old verdict"
    assert not reader.wanted(8, 200.0, 200.0 + links.LINGER + 1), "not read for ever"


@pytest.mark.parametrize("raw, addresses", [
    (verdict(outlier=1), {0: ADDRS[0], 1: ADDRS[1]}),  # the round has 2 agents, the verdict says 3
    (b"", ADDRS),
    (b"not json", ADDRS),
])
def test_a_verdict_that_is_not_the_rounds_is_not_taken(raw, addresses):
    reader = links.LinkReader()
    reader.wanted(7, 100.0, 100.0)
    reader.take(raw, addresses)
    assert reader.describe() is None


def test_the_operator_reads_the_verdict_and_drops_one_that_is_not_valid():
    body = describe(None, RoundTracker(), now=1.0, epoch="ab", run_id="r", min_nodes=1, max_nodes=3,
                    links={"round": 7, "world": 3, "seconds": 0.1, "outlier": ADDRS[1], "reason": "slow\nlink"})
    view = store_reply.parse_state(json.dumps(body).encode())
    assert view is not None and view.links == LinksView(7, 3, 0.1, ADDRS[1], "slow link")
    body["links"]["outlier"] = "not-an-ip"
    view = store_reply.parse_state(json.dumps(body).encode())
    assert view is not None and view.links is None and view.round is None


def pods(n: int = 3):
    return [rdzv(), *(worker(i, node=SLOW if i == 1 else f"node-{i}") for i in range(n))]


def plan(links_view: LinksView | None, round: int = 7, status=None, **spec):
    fields = {"replicas": 3, "maxReplicas": 3, **spec}
    seen = observed(pods(), store=store(round=round, nodes=3, links=links_view))
    return planner.plan(job(status or running_status(), **fields), seen, NOW)


def deletes(result: planner.Plan) -> list[planner.DeletePod]:
    return [a for a in result.actions if isinstance(a, planner.DeletePod)]


def test_the_outlier_of_the_current_round_is_replaced_once_and_its_node_avoided_with_nothing_charged():
    found = LinksView(7, 3, 0.12, ADDRS[1], "rank 1's best link: 3.1 MB/s")
    done = plan(found)
    stop, = deletes(done)
    assert (stop.name, stop.event.reason) == ("train-worker-1", "SlowLinkReplaced")
    avoided, = done.status.avoided_nodes
    assert (avoided.node, avoided.reason) == (SLOW, "SlowLink") and done.status.restarts == 0
    # The same answer again, the deletion now seen: nothing more.
    seen = observed([rdzv(), worker(0, node="node-0"), worker(1, node=SLOW, deleting=True), worker(2, node="node-2")],
                    store=store(round=7, nodes=3, links=found))
    again = planner.plan(job(done.status.model_dump(by_alias=True, mode="json"), replicas=3, maxReplicas=3), seen,
                         NOW)
    assert deletes(again) == []


@pytest.mark.parametrize("links_view, round, spec, why", [
    (None, 7, {}, "no verdict"),
    (LinksView(7, 3, 0.1), 7, {}, "no outlier"),
    (LinksView(6, 3, 0.1, ADDRS[1], "x"), 7, {}, "a verdict of an older round"),
    (LinksView(7, 3, 0.1, "10.244.0.99", "x"), 7, {}, "an address that is none of the job's workers"),
    (LinksView(7, 3, 0.1, "10.244.0.5", "x"), 7, {}, "the store pod's own address"),
    (LinksView(7, 3, 0.1, ADDRS[1], "x"), 7, {"nodeCheck": {"linkProbe": False}}, "the probe turned off"),
])
def test_nothing_is_replaced_without_a_verdict_naming_a_running_worker_of_the_current_round(
        links_view, round, spec, why):
    assert deletes(plan(links_view, round, **spec)) == [], why


def test_the_store_reads_a_verdict_only_for_rounds_that_were_probed():
    from datetime import timedelta

    import torch.distributed as dist
    from store_states import A, B, C, make_state

    from elasticjob_store.control import Control

    tcp_store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True,
                              timeout=timedelta(seconds=10))
    clock = [1_900_000_000.0]
    for round_number, members in ((1, (A, B)), (2, (A, B, C))):
        control = Control(tcp_store, "run-1", 1, 3, clock=lambda: clock[0], log=lambda _line: None)
        state = make_state(round=round_number, complete=True, participants=members)
        control.tracker.track(state, clock[0])
        tcp_store.set(links.key("run-1", round_number), verdict(outlier=None, world=len(members)))
        control.read_agents(state, clock[0])
        assert (control.links.describe() is not None) == (len(members) >= links.MIN_AGENTS), members
