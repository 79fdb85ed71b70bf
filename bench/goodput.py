"""Goodput under periodic faults: ETTR and where the lost seconds went, three ways of running one training.

ETTR is the share of wall time spent on steps that count. The three setups are measured in one run on the same nodes.

The training is examples/train_ddp.py as the e2e tests run it: 3 workers on real nodes, a step about every 0.13 s
(a 0.1 s pause and a forward of 80 matmuls, which a slow node slows), a checkpoint every 10 steps. Once it steps,
the bench measures for --minutes (20) with a fault every --fault-every minutes (2), the kinds in turn: a worker's
container SIGKILLed, rank 0's, a node lost (back after 60 s), a worker partitioned (healed after 60 s), the store
killed (for the StatefulSet: pod 0, whose agent hosts torch's store), a scale down to 2 and back to 3 after 30 s, a
preemption by Kueue (a higher-priority job held 30 s; skipped where the cluster has no Kueue), and two nodes that
stay bad (tests/e2e/test_bad_nodes.py): a node turned sick (every training process there exits 1; healed after
90 s) and a worker slowed to a fifth of a core (its cgroup's CPU quota; lifted after 60 s, if the pod is still
there). The setups:

- operator:          an ElasticJob through this operator with its defaults (the kit: warm worker starts);
- one warm spare:    the same with spec.spares: 1 (--setups spares; not in the default run): faults hit the pods
                     that train, never the spare;
- warmStarts: false: the same with spec.warmStarts false;
- by hand:           torchrun agents in a StatefulSet, c10d rendezvous on pod 0, every pod restarted on any failure
                     (goodput_by_hand.yaml), no operator. Its pods run the same training, mount the same
                     checkpoint dir (a sick node's marker) and are throttled the same way; nothing moves them.

ETTR comes from the training's own step records (goodput_measure.py: steps done again after a restore count
once); the ledger's columns are status.goodput's incidents in the window, their phases summed, and whether their
sum is within 10% of the measured loss.

    make bench-goodput                      # localcluster up --real-nodes --kueue, then the full run (about 75 min)
    .venv/bin/python bench/goodput.py --quick   # 4 minutes a setup, one rank-0 kill and one partition
    .venv/bin/python bench/goodput.py --minutes 5 --kinds sick,slow --setups operator   # the nodes that stay bad
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parent))

import goodput_measure as gm  # noqa: E402
from goodput_setups import ByHand, OperatorJob, Undo, has_kueue, heal, sick_marker  # noqa: E402
from harness import KIT_ARGS, STATE_DIR, Api, Operator, wait  # noqa: E402
from recovery import rank0_host, real_nodes, records  # noqa: E402

# Seconds until a fault is undone. A sick node stays sick for 90 s: several times the operator's whole recovery from
# one (13-15 s in the e2e: the node avoided, the pod moved), and long enough for the by-hand pod's crash loop to reach
# the kubelet's 40 s back-off, so that a node that stays bad is what is measured; yet healed before the next fault at
# the default 2 minutes, so that two faults do not overlap (the by-hand pod's back-off under way at the heal may still
# run into the next fault's share). A slow worker stays slow for 60 s, as a node lost or a partition: twice the e2e's
# 30 s from the slowdown to the straggler's replacement, and within this fault's half of the interval
# (goodput_measure.lost_per_fault), which is all that a by-hand pod's slowness costs (nothing replaces it).
HOLDS = {"node": 60.0, "partition": 60.0, "scale": 30.0, "preemption": 30.0, "sick": 90.0, "slow": 60.0}
THROTTLE_PERCENT = 20  # a slow worker's share of one core: tests/e2e/test_bad_nodes.py's (a tenth starves its agent)
WARM_STEP = 20  # the window opens once the training has done this many steps
POLL = 1.0  # how often the ledger is read: it keeps only its last few incidents
TRAINED_WITHIN = 10.0  # a worker that stepped this recently trains (a warm spare never steps)
SETTLE = 120.0  # after the window: the longest wait for the last incident to close


# --- faults -----------------------------------------------------------------------------------------------


class NotMade(Exception):
    """A fault this setup cannot be given now: skipped, and the reason printed."""


def training(setup, api: Api, ns: str) -> list[str]:
    """The workers that train. With warm spares (spec.spares), those that stepped in the last TRAINED_WITHIN
    seconds: a spare trains nothing, and a fault there would cost the job nothing (a replacement under a lost
    pod's name has only that pod's older steps)."""
    workers = setup.workers(api, ns)
    if not getattr(setup, "spares", 0):
        return workers
    recent = {r["host"] for r in records(ns) if r["time"] > time.time() - TRAINED_WITHIN}
    return [p for p in workers if p in recent]


def victim(setup, api: Api, ns: str) -> str:
    """A worker that is neither rank 0 nor the store's pod."""
    spare = [p for p in training(setup, api, ns) if p not in (rank0_host(ns), setup.store_pod)]
    if not spare:
        raise RuntimeError(f"no worker besides rank 0 and the store runs in {ns}")
    return spare[0]


def node_of(api: Api, ns: str, pod: str) -> str:
    return api.core.read_namespaced_pod(pod, ns).spec.node_name


def spare_node(setup, api: Api, ns: str) -> str:
    """The node of a worker that is not rank 0: one that holds neither rank 0 nor the store where one may choose,
    else one without rank 0 (the store's), else any (every worker beside rank 0's)."""
    rank0 = rank0_host(ns)
    rank0_node, store_node = node_of(api, ns, rank0), node_of(api, ns, setup.store_pod)
    nodes = [node_of(api, ns, p) for p in training(setup, api, ns) if p != rank0]
    if not nodes:
        raise RuntimeError(f"no worker besides rank 0 runs in {ns}")
    return min(nodes, key=lambda n: (n == rank0_node, n == store_node))  # the first of the best


def kill(ns: str, pod: str) -> None:
    from localcluster import faults

    faults.kill_pod(ns, pod, signal.SIGKILL, STATE_DIR)


def lose_node(setup, api: Api, ns: str) -> Undo:
    from localcluster import faults

    node = spare_node(setup, api, ns)
    faults.node_loss(node, STATE_DIR)
    return lambda: faults.restore_node(node, STATE_DIR)


def cut(setup, api: Api, ns: str) -> Undo:
    from localcluster import partition

    pod = victim(setup, api, ns)
    partition.partition(ns, pod, STATE_DIR)
    return lambda: heal(ns, pod)


def scale_down(setup, api: Api, ns: str) -> Undo:
    setup.scale(api, ns, 2)
    return lambda: setup.scale(api, ns, 3)


def preempt(setup, api: Api, ns: str) -> Undo:
    undo = setup.preempt(api, ns)
    if undo is None:
        raise NotMade("no Kueue")
    return undo


def sicken(setup, api: Api, ns: str) -> Undo:
    """Every training process on a spare node exits 1 from now on (tests/e2e's Faults.sicken): the marker file
    that the setups' training reads (goodput_setups.for_bad_nodes); undone by removing it."""
    marker = sick_marker(ns, spare_node(setup, api, ns))
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{time.time()}\n")
    return lambda: marker.unlink(missing_ok=True)


def throttle(ns: str, pod: str, percent: int | None) -> int:
    """Caps the pod's running containers at `percent` of one core (None lifts it): how many were capped."""
    from localcluster import faults

    return faults.nodes(STATE_DIR).throttle(ns, pod, percent)


def uid_of(api: Api, ns: str, pod: str) -> str | None:
    """The pod's uid; None once it is gone."""
    try:
        return api.core.read_namespaced_pod(pod, ns).metadata.uid
    except ApiException as error:
        if error.status == 404:
            return None
        raise


def slow_down(setup, api: Api, ns: str) -> Undo:
    """A spare worker's CPU capped (tests/e2e's Faults.throttle); lifted later if that very pod is still there
    (the operator replaces a straggler, maybe under the same name)."""
    pod = victim(setup, api, ns)
    uid = uid_of(api, ns, pod)
    if not throttle(ns, pod, THROTTLE_PERCENT):
        raise NotMade(f"{pod} has no running container to throttle")

    def lift() -> None:
        if uid is not None and uid_of(api, ns, pod) == uid:
            throttle(ns, pod, None)

    return lift


FAULTS: dict[str, Callable[..., Undo | None]] = {  # (setup, api, ns) -> what undoes the fault, if anything does
    "worker": lambda setup, api, ns: kill(ns, victim(setup, api, ns)),
    "rank0": lambda setup, api, ns: kill(ns, rank0_host(ns)),
    "store": lambda setup, api, ns: kill(ns, setup.store_pod),
    "node": lose_node,
    "partition": cut,
    "scale": scale_down,
    "preemption": preempt,
    "sick": sicken,
    "slow": slow_down,
}


def inject(kind: str, setup, api: Api, ns: str) -> tuple[Undo | None, str | None]:
    """Makes the fault; returns what undoes it (after HOLDS[kind]) and, where it was not made, why."""
    try:
        return FAULTS[kind](setup, api, ns), None
    except NotMade as reason:
        return None, str(reason)


# --- one setup --------------------------------------------------------------------------------------------


class Run:
    """One setup's measured window: the faults made, their undoing when due, the ledger read as it goes."""

    def __init__(self, setup, api: Api, ns: str):
        self.setup, self.api, self.ns = setup, api, ns
        self.incidents: dict[tuple[str, str], dict] = {}
        self.undos: list[tuple[float, Undo]] = []
        self.made: list[gm.Fault] = []
        self.skipped: list[str] = []

    def follow(self, until: float) -> None:
        """Until `until`: undo each fault whose hold ran out, and read the ledger every POLL seconds."""
        while (now := time.time()) < until or any(at <= now for at, _ in self.undos):
            for due in [u for u in self.undos if u[0] <= now]:
                self.undos.remove(due)
                due[1]()
            if self.setup.has_ledger:
                gm.gather(self.incidents, self.setup.ledger(self.api, self.ns))
            time.sleep(min(POLL, max(0.0, until - time.time())))  # a clock to keep, not a condition to wait on

    def fault(self, fault: gm.Fault, start: float) -> None:
        undo, why_not = inject(fault.kind, self.setup, self.api, self.ns)
        if why_not is not None:
            self.skipped.append(fault.kind)
            print(f"  {self.setup.name:>18} {fault.at:6.0f} s {fault.kind}: skipped ({why_not})", flush=True)
            return
        self.made.append(gm.Fault(round(time.time() - start, 3), fault.kind))
        if undo is not None:
            self.undos.append((time.time() + HOLDS[fault.kind], undo))
        print(f"  {self.setup.name:>18} {fault.at:6.0f} s {fault.kind}", flush=True)

    def undo_all(self) -> None:
        """What is still cut off or lost comes back before the setup is stopped."""
        for _, undo in self.undos:
            undo()
        self.undos.clear()

    def settled(self) -> bool:
        goodput = self.setup.ledger(self.api, self.ns) or {}
        gm.gather(self.incidents, goodput)
        return not goodput.get("openIncident")


def measure(setup, api: Api, minutes: float, faults: list[gm.Fault]) -> gm.Result:
    with api.namespace("bench-goodput") as ns:
        setup.start(api, ns)
        try:
            wait(lambda: max((r["step"] for r in records(ns)), default=0) >= WARM_STEP, 300,
                 f"{setup.name}: step {WARM_STEP}", interval=1)
            run = Run(setup, api, ns)
            start = time.time()
            end = start + minutes * 60
            for fault in faults:
                run.follow(start + fault.at)
                run.fault(fault, start)
            run.follow(end)
            run.undo_all()
            if setup.has_ledger:
                try:
                    wait(run.settled, SETTLE, f"{setup.name}: the last incident closed", interval=POLL)
                except TimeoutError as error:
                    print(f"  {setup.name}: {error}", flush=True)
            found = records(ns)
        finally:
            setup.stop(api, ns)
    incidents = gm.in_window(list(run.incidents.values()), start, end) if setup.has_ledger else None
    return gm.Result(setup.name, end - start, gm.ettr(found, start, end),
                     (end - start) - gm.productive_seconds(found, start, end),
                     gm.lost_per_fault(found, start, end, run.made), incidents, run.skipped, start,
                     gm.ettr(found, start, end, weighted=True))


# --- the tables -------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="the measured window, per setup")
    parser.add_argument("--fault-every", type=float, default=2.0, help="minutes between faults")
    parser.add_argument("--kinds", default="", help=f"comma-separated, in turn (default: {','.join(gm.KINDS)})")
    parser.add_argument("--setups", default="operator,warm-off,by-hand",
                        help="of operator, spares (the operator with one warm spare), warm-off, by-hand")
    parser.add_argument("--quick", action="store_true",
                        help="4 minutes a setup, a fault every 1.5: one of each of " + ",".join(gm.QUICK_KINDS))
    args = parser.parse_args()
    minutes, every = (4.0, 1.5) if args.quick else (args.minutes, args.fault_every)
    kinds = tuple(k for k in args.kinds.split(",") if k) or (gm.QUICK_KINDS if args.quick else gm.KINDS)
    unknown = set(kinds) - set(gm.KINDS)
    if unknown:
        parser.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(gm.KINDS)}")
    if not real_nodes():
        print("bench/goodput.py measures on real nodes: start the cluster with `localcluster up --real-nodes`")
        return 2
    faults = gm.rotation(minutes, every, kinds)
    api = Api()
    api.install_crd()
    kueue = "preemption" in kinds and has_kueue(api)
    wanted = args.setups.split(",")
    results: list[gm.Result] = []
    operator_setups = [s for s in (OperatorJob("operator", warm=True, kueue=kueue),
                                   OperatorJob("one warm spare", warm=True, kueue=kueue, spares=1),
                                   OperatorJob("warmStarts: false", warm=False, kueue=kueue))
                       if {"operator": "operator", "one warm spare": "spares",
                           "warmStarts: false": "warm-off"}[s.name] in wanted]
    if operator_setups:
        log = STATE_DIR / "bench-goodput-operator.log"
        with Operator(log, [*KIT_ARGS, *(["--kueue"] if kueue else [])]):
            results += [measure(s, api, minutes, faults) for s in operator_setups]
    if "by-hand" in wanted:
        results.append(measure(ByHand("by hand", kueue=kueue), api, minutes, faults))
    print(f"\ngoodput over {minutes:g} minutes a setup, a fault every {every:g} minutes "
          f"({', '.join(f.kind for f in faults)}){'' if kueue or 'preemption' not in kinds else '; no Kueue'}\n")
    print(gm.render(gm.summary_rows(results)))
    print("\nseconds lost per fault, by kind: median (faults)\n")
    print(gm.render(gm.per_kind_rows(results)))
    for result in results:
        if result.incidents:
            print(f"\nthe ledger's incidents, {result.setup} (seconds from the window's start)\n")
            print(gm.render(gm.incident_rows(result, result.start)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
