"""The link probe among a round's agents (elasticjob_warm/linkprobe.py): its schedule, the outlier rule and the
report's parser as tables (milliseconds), then real runs: agents in processes of their own on the loopback, a
real TCPStore, gloo between them (seconds: each process imports torch). Faults come through the module's hook
ELASTICJOB_LINK_PROBE_FAULT (`slow`: every send and receive of that agent sleeps; `crash`: it dies mid-probe)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from elasticjob_store import links
from elasticjob_warm import linkprobe

FAST, LAT = 1e9, 2e-3  # a healthy link: 1 GB/s, a 2 ms round trip (so that 4x passes the 5 ms margin)
ROUND = "round/7"  # the round's store is a PrefixStore over the job's, as the agent's is
CHILD_SECONDS = 120  # a child's whole life, torch's import included, on a loaded 2-core machine


def matrix(world: int, sick: dict[int, tuple[float, float]] | None = None) -> list[dict]:
    """Every rank's row, as measure() returns it: a link is as slow as its sicker end, `sick` giving a rank's
    (bandwidth divided by, latency multiplied by)."""
    sick = sick or {}

    def link(a: int, b: int) -> dict[str, float]:
        bw_div = max(sick.get(a, (1, 1))[0], sick.get(b, (1, 1))[0])
        lat_mul = max(sick.get(a, (1, 1))[1], sick.get(b, (1, 1))[1])
        return {"latency": LAT * lat_mul, "bandwidth": FAST / bw_div}

    return [{"rank": r, "world": world, "links": {p: link(r, p) for p in range(world) if p != r}, "seconds": 0.1}
            for r in range(world)]


# ---------------------------------------------------------------- the schedule


@pytest.mark.parametrize("world", range(1, 14))
def test_the_schedule_meets_every_pair_once_and_no_rank_twice_in_a_turn(world):
    turns = linkprobe.schedule(world)
    assert len(turns) == (world if world % 2 else world - 1) or world == 1
    met = []
    for peers in turns:
        assert all(peers[peers[rank]] == rank and peers[rank] != rank for rank in peers)  # pairs, each once
        assert set(peers) <= set(range(world))
        met += [(rank, peer) for rank, peer in peers.items() if rank < peer]
    assert sorted(met) == list(itertools.combinations(range(world), 2))


# ---------------------------------------------------------------- the outlier, from the rows


@pytest.mark.parametrize(("rows", "named"), [
    (matrix(3), None),
    (matrix(8), None),
    (matrix(3, {2: (10, 1)}), 2),  # 10x less bandwidth
    (matrix(5, {0: (10, 1)}), 0),
    (matrix(3, {1: (1, 10)}), 1),  # 10x the latency
    # 4x the latency in a world of 3: a healthy rank's median link (the mean of its two) would be 2.5x, and
    # the sick rank's 4x no more than 1.6x that; its best link says it.
    (matrix(3, {1: (1, 4)}), 1),
    (matrix(3, {1: (2.5, 2.5)}), None),  # not a factor 3 off
    # A factor 3 off, but by less than the margin (5 ms): 3.2 x 2 ms is 4.4 ms more; 4 x 1 GB/s is 3.1 ms
    # more for each MiB.
    (matrix(3, {1: (1, 3.2)}), None),
    (matrix(3, {2: (4, 1)}), None),
    (matrix(6, {1: (5, 1), 4: (20, 1)}), 4),  # the worse of two
    (matrix(2, {1: (100, 100)}), None),  # a pair cannot say which end is slow
    (matrix(1), None),
    ([], None),
], ids=["3-equal", "8-equal", "3-bandwidth", "5-bandwidth", "3-latency", "3-latency-4x", "under-factor",
        "latency-within-margin", "bandwidth-within-margin", "worst-of-two", "2-ranks", "1-rank", "no-rows"])
def test_the_outlier_is_the_rank_whose_links_are_all_slow(rows, named):
    found = linkprobe.outlier(rows)
    assert (found and found[0]) == named
    if named is not None:
        assert found[1].startswith(f"rank {named}'s best link: ") and "MB/s" in found[1] and "ms" in found[1]
        assert "\n" not in found[1]


def test_the_margin_is_what_spares_a_rank_just_past_the_factor():
    assert linkprobe.outlier(matrix(3, {1: (1, 3.2)}), margin=0)[0] == 1
    assert linkprobe.outlier(matrix(3, {2: (4, 1)}), margin=0)[0] == 2
    assert linkprobe.outlier(matrix(3, {2: (10, 1)}), margin=0.011) is None  # 9.4 ms more per MiB


def broken(**changes) -> dict:
    """Rank 3's row of a world of 4, its links 10x slow: named, were it taken, so each case shows it is not."""
    return {**matrix(4, {3: (10, 10)})[3], **changes}


HEALTHY = matrix(4)[:3]  # ranks 0 to 2
GOOD = matrix(3, {2: (10, 1)})


def one_link(**link) -> dict:
    return {0: link}


@pytest.mark.parametrize(("rows", "named"), [
    (GOOD + ["text", None, 3, {}, []], 2),
    (HEALTHY + [broken()], 3),  # the row the cases below break, whole
    (HEALTHY + [broken(rank="3")], None),
    (HEALTHY + [broken(rank=True)], None),
    (HEALTHY + [broken(rank=3.0)], None),
    (HEALTHY + [broken(links={})], None),
    (HEALTHY + [broken(links=[1, 2])], None),
    (HEALTHY + [broken(links=one_link(latency=LAT * 10))], None),  # no bandwidth
    (HEALTHY + [broken(links=one_link(latency=float("inf"), bandwidth=FAST / 10))], None),
    (HEALTHY + [broken(links=one_link(latency=float("nan"), bandwidth=FAST / 10))], None),
    (HEALTHY + [broken(links=one_link(latency=-1.0, bandwidth=FAST / 10))], None),
    (HEALTHY + [broken(links=one_link(latency=LAT, bandwidth=0.0))], None),
    (HEALTHY + [broken(links=one_link(latency=LAT, bandwidth="fast"))], None),
    ([GOOD[0], {**GOOD[0], "links": GOOD[2]["links"]}, GOOD[1], GOOD[2]], 2),  # a rank's second row ignored
    # Two rows that disagree on their one link (each row is its rank's own): still a pair, no outlier.
    ([matrix(2)[0], matrix(2, {1: (10, 10)})[1]], None),
], ids=["not-rows", "whole", "rank-str", "rank-bool", "rank-float", "no-links", "links-list", "no-bandwidth",
        "inf", "nan", "negative", "zero-bandwidth", "bandwidth-str", "duplicate", "pair-disagrees"])
def test_malformed_rows_are_ignored(rows, named):
    found = linkprobe.outlier(rows)
    assert (found and found[0]) == named


def test_rank0_reads_each_ranks_row_from_the_store_and_leaves_out_what_is_not_one():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    rows = matrix(6, {5: (10, 1)})
    written = [{"v": 1, **row} for row in rows]
    written[1]["v"] = 2
    written[2]["rank"] = 3
    written[3]["seconds"] = "soon"
    for rank, row in enumerate(written):
        master.set(linkprobe.key("row", rank), json.dumps(row))
    master.set(linkprobe.key("row", 4), b"\xff not json")
    read = linkprobe.read_rows(master, 6, time.monotonic() + 5)
    assert [row["rank"] for row in read] == [0, 5] and read[0]["links"]["1"] == rows[0]["links"][1]
    with pytest.raises(linkprobe.Failed, match=r"^rank 6, 7 wrote no row$"):
        linkprobe.read_rows(master, 8, time.monotonic() + 0.2)


# ---------------------------------------------------------------- the report, and its parser


def test_the_report_names_the_outlier_with_each_ranks_best_figures():
    report = linkprobe.verdict(matrix(3, {2: (10, 1)}), 3)
    assert report == {"v": 1, "world": 3, "seconds": 0.1, "outlier": 2, "reason": linkprobe.outlier(
        matrix(3, {2: (10, 1)}))[1], "bandwidthMBps": [1000, 1000, 100], "latencyUs": [2000, 2000, 2000]}
    assert links.check(json.dumps(report).encode()) == report
    missing = linkprobe.verdict(matrix(3)[:2], 3)  # rank 2 without a row: no figures, no outlier
    assert missing["bandwidthMBps"][2] is None and missing["outlier"] is None
    assert links.check(json.dumps(missing).encode()) == missing


def test_the_largest_report_fits_its_bound():
    """300 ranks, every figure at its clamp, the longest reason: the summary stops at 256 ranks and fits 4 KB."""
    rows = matrix(300, {7: (1e9, 1e9)})
    for row in rows:
        row["seconds"] = 1e9
        for link in row["links"].values():
            link["bandwidth"] = link["bandwidth"] * 1e9 if link["bandwidth"] > 1 else link["bandwidth"]
    report = linkprobe.verdict(rows, 300)
    raw = json.dumps(report, separators=(",", ":")).encode()
    assert len(raw) <= links.MAX_REPORT_BYTES and len(report["bandwidthMBps"]) == 256
    assert report["outlier"] == 7 and links.check(raw) == report
    report["reason"] = "x" * links.MAX_REASON
    report["latencyUs"] = [links.MAX_MICROSECONDS] * 256
    report["bandwidthMBps"] = [links.MAX_MBPS] * 256
    raw = json.dumps(report, separators=(",", ":")).encode()  # as run() writes it
    assert len(raw) <= links.MAX_REPORT_BYTES and links.check(raw) == report


VALID = {"v": 1, "world": 3, "seconds": 0.25, "outlier": 1, "reason": "rank 1's best link: 1.0 MB/s",
         "bandwidthMBps": [1000, 1, None], "latencyUs": [100, 100, None]}


def changed(**fields) -> bytes:
    return json.dumps({**VALID, **fields}).encode()


def without(name: str) -> bytes:
    return json.dumps({k: v for k, v in VALID.items() if k != name}).encode()


@pytest.mark.parametrize("raw", [
    "not bytes", None, b"", b"\xff\xfe", b"{", b"[]", b"null", b"1",
    b" " * 4097 + json.dumps(VALID).encode(),  # over 4 KB, though valid JSON
    b"[" * 2000 + b"]" * 2000,  # nested past the decoder's recursion
    without("reason"), changed(extra=1),
    changed(v=2), changed(v=True), changed(v="1"), changed(v=1.0),
    changed(world=0), changed(world=True), changed(world=1 << 17), changed(world="3"), changed(world=3.0),
    changed(seconds=-1), changed(seconds=3601), changed(seconds="0.2"), changed(seconds=None), changed(seconds=True),
    b'{"v":1,"world":3,"seconds":NaN,"outlier":null,"reason":null,"bandwidthMBps":[1,1,1],"latencyUs":[1,1,1]}',
    b'{"v":1,"world":3,"seconds":Infinity,"outlier":null,"reason":null,"bandwidthMBps":[1,1,1],"latencyUs":[1,1,1]}',
    changed(outlier=3), changed(outlier=-1), changed(outlier=True), changed(outlier="1"), changed(outlier=None),
    changed(reason=None), changed(outlier=None, reason="no outlier"), changed(reason=7),
    changed(reason="x" * (links.MAX_REASON + 1)), changed(reason="rank 1\nelasticjob: forged line"),
    changed(bandwidthMBps=[1, 1]), changed(bandwidthMBps=[1, 1, 1, 1]), changed(bandwidthMBps="1,1,1"),
    changed(bandwidthMBps=[1, 1, -1]), changed(bandwidthMBps=[1, 1, 1.5]), changed(bandwidthMBps=[1, 1, True]),
    changed(bandwidthMBps=[1, 1, links.MAX_MBPS + 1]), changed(bandwidthMBps=[1, 1, "1"]),
    changed(latencyUs=[1, 1, links.MAX_MICROSECONDS + 1]), changed(latencyUs=[1, 1, [1]]),
    changed(latencyUs=None),
    changed(world=300, outlier=None, reason=None),  # 300 ranks, yet 3 figures (the summary has 256)
])
def test_parse_report_refuses_anything_malformed(raw):
    assert links.check(raw) is None


def test_parse_report_takes_a_valid_report_whatever_its_world():
    assert links.check(json.dumps(VALID).encode()) == VALID
    big = {**VALID, "world": 300, "bandwidthMBps": [5] * 256, "latencyUs": [None] * 256}
    assert links.check(json.dumps(big).encode()) == big


# ---------------------------------------------------------------- settings, in this process


@pytest.mark.parametrize("environ", [
    {linkprobe.SECONDS_ENV: "0"}, {linkprobe.SECONDS_ENV: "soon"}, {linkprobe.SECONDS_ENV: "601"},
    {linkprobe.FAULT_ENV: "fast"},
])
def test_a_bad_setting_fails_the_probe_in_one_line_and_never_raises(environ, capsys):
    assert linkprobe.run(None, 0, 3, environ) is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("elasticjob_warm.torchrun: link probe failed (training goes on): ")


def test_a_world_of_one_reports_at_once_and_leaves_the_default_group_unset(capsys):
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    store = dist.PrefixStore(ROUND, master)
    report = linkprobe.run(store, 0, 1, {})
    assert report is not None and report["world"] == 1 and report["outlier"] is None
    assert links.check(master.get(f"{ROUND}/{linkprobe.REPORT_KEY}")) == report
    assert not dist.is_initialized()
    assert capsys.readouterr().err.startswith("elasticjob_warm.torchrun: link probe of 1 agents in ")


# ---------------------------------------------------------------- real agents, each in its own process


CHILD = textwrap.dedent(f"""
    import json, os, sys, time
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from elasticjob_warm import linkprobe
    port, rank, world = map(int, sys.argv[1:])
    store = dist.PrefixStore({ROUND!r}, dist.TCPStore("127.0.0.1", port, is_master=False,
                                                     timeout=timedelta(seconds=30)))
    torch.zeros(1 << 20, dtype=torch.uint8)  # torch's intra-op pool starts its thread here, not in the probe
    threads, began = len(os.listdir("/proc/self/task")), time.monotonic()
    result = linkprobe.run(store, rank, world, os.environ)
    print(json.dumps({{"result": result, "wall": time.monotonic() - began, "initialized": dist.is_initialized(),
                      "threads": [threads, len(os.listdir("/proc/self/task"))]}}))
""")


@pytest.fixture
def master():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def agents(master, world: int, ranks=None, seconds: float = 30, faults=None) -> list[dict]:
    """`ranks` (all of the world's unless given) in processes of their own, each running the probe; once all
    have exited, what each returned and the lines it logged. A hung agent is killed once the others are done."""
    faults, ranks = faults or {}, list(range(world) if ranks is None else ranks)
    procs = []
    for rank in ranks:
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", linkprobe.SECONDS_ENV: str(seconds)}
        env.pop(linkprobe.FAULT_ENV, None)
        if rank in faults:
            env[linkprobe.FAULT_ENV] = faults[rank]
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD, str(master.port), str(rank), str(world)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = {}
    for rank, proc in sorted(zip(ranks, procs), key=lambda started: faults.get(started[0]) == "hang"):
        if faults.get(rank) == "hang":  # last: the others are done
            proc.kill()
        try:
            out, err = proc.communicate(timeout=CHILD_SECONDS)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            pytest.fail(f"an agent's probe had not ended after {CHILD_SECONDS} s")
        lines = [line for line in err.splitlines() if line.startswith(linkprobe.LINE)]
        done[rank] = {"code": proc.returncode, "lines": lines, "err": err, **(json.loads(out) if out else {})}
    return [done[rank] for rank in ranks]


def published(master) -> dict | None:
    raw = master.get(f"{ROUND}/{linkprobe.REPORT_KEY}")
    report = links.check(raw)
    assert report is not None, raw
    return report


def test_three_healthy_agents_have_no_outlier(master):
    done = agents(master, 3)
    assert [d["code"] for d in done] == [0, 0, 0], [d["err"] for d in done]
    assert all(len(d["lines"]) == 1 and not d["initialized"] for d in done), done
    assert all(d["threads"][0] == d["threads"][1] for d in done), done  # the gloo group's threads ended
    report = published(master)
    assert done[0]["result"] == report and report["world"] == 3 and report["outlier"] is None, report
    assert done[0]["lines"][0].endswith(": no outlier")
    for rank in (1, 2):
        row = done[rank]["result"]
        assert row["rank"] == rank and sorted(row["links"]) == sorted(str(p) for p in range(3) if p != rank)
    assert all(bw and lat for bw, lat in zip(report["bandwidthMBps"], report["latencyUs"]))


def test_the_slow_agent_is_named(master):
    done = agents(master, 3, faults={1: "slow"})
    report = published(master)
    assert report["outlier"] == 1 and report["reason"].startswith("rank 1's best link: "), report
    assert done[0]["lines"][0].startswith("elasticjob_warm.torchrun: link probe of 3 agents in ")
    assert "outlier rank 1: rank 1's best link" in done[0]["lines"][0]


def test_two_agents_name_no_outlier_even_with_one_slow(master):
    done = agents(master, 2, faults={1: "slow"})
    report = published(master)
    assert report["world"] == 2 and report["outlier"] is None and done[0]["result"] == report
    assert report["latencyUs"][0] == report["latencyUs"][1] > 10_000  # one link, its both ends: slow


def test_an_agent_that_never_comes_fails_the_probe_within_its_deadline(master):
    done = agents(master, 3, ranks=[0, 1], seconds=2)
    for agent in done:
        assert agent["code"] == 0 and agent["result"] is None, agent["err"]
        assert agent["lines"] == ["elasticjob_warm.torchrun: link probe failed (training goes on): rank 2 did not "
                                  "come to the probe"]
        assert 1.9 < agent["wall"] < 4, agent["wall"]
    assert not master.check([f"{ROUND}/{linkprobe.REPORT_KEY}"])


def test_an_agent_that_dies_mid_probe_is_named_and_nobody_hangs(master):
    done = agents(master, 3, seconds=20, faults={2: "crash"})
    assert done[2]["code"] == -9
    for agent in done[:2]:
        assert agent["code"] == 0 and agent["result"] is None, agent["err"]
        [line] = agent["lines"]
        assert line.startswith("elasticjob_warm.torchrun: link probe failed (training goes on): ") and (
            "with rank 2 failed: " in line), line
        assert agent["wall"] < 15, agent["wall"]  # the peer's death is seen, not waited out
    assert not master.check([f"{ROUND}/{linkprobe.REPORT_KEY}"])


def test_an_agent_that_hangs_is_named_once_the_deadline_passes(master):
    done = agents(master, 3, seconds=4, faults={0: "hang"})  # rank 0, whom both others meet
    assert done[0]["code"] == -9  # killed by the test, once the others were done
    for agent in done[1:]:
        assert agent["code"] == 0 and agent["result"] is None, agent["err"]
        [line] = agent["lines"]
        assert "with rank 0 failed: " in line, line
        assert 3.9 < agent["wall"] < 7, agent["wall"]
        assert agent["threads"][0] == agent["threads"][1], agent  # the group's threads ended with it
    assert not master.check([f"{ROUND}/{linkprobe.REPORT_KEY}"])


class Refusing:
    """A gloo group whose pair with every peer is closed already: send and recv raise at once, no Work."""

    def send(self, tensors, peer, tag):
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:24192")

    recv = send


@pytest.mark.parametrize("gave_up", [False, True])
def test_a_send_gloo_refuses_at_once_is_blamed_on_its_peer(master, gave_up):
    """Seen in CI: an agent whose peer had died mid-probe logged gloo's words alone, naming no rank, because the
    refusal came from posting the send, not from waiting on it."""
    if gave_up:
        master.set(linkprobe.key("failed", 2), "the ping with rank 1 failed: reset")
    probe = linkprobe.Probe(Refusing(), master, 0, time.monotonic() + 5, 8, None)
    why = "rank 2 gave up first: the ping with rank 1 failed" if gave_up else "the ping with rank 2 failed: "
    with pytest.raises(linkprobe.Failed, match=why):
        probe.op(True, probe.small, 2, "ping")
    probe.samples = {2: [(0.001, 0.01)]}
    with pytest.raises(linkprobe.Failed, match="rank 2 gave up first" if gave_up else "exchange of figures with rank 2"):
        probe.links()
