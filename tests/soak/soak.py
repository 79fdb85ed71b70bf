"""The soak: minutes of randomized orderings against the real API server, with the invariants checked all along.

It drives one namespace of the local cluster: jobs created, scaled, deleted and re-created under the same
names; workers crashed, finished, force-deleted, evicted, drained; the operator's replicas (two, with leader
election on one Lease, as the chart runs them) SIGKILLed at random moments, mostly the leader, and each started
again; kube-apiserver and etcd restarted; a node lost. Then the churn stops and every job must settle. It prints
a table of what it did and of the violations per invariant, every one of which must be 0.

    make soak                       # 10 minutes, 60 operator kills, both restarts, a lost node
    .venv/bin/python tests/soak/soak.py --minutes 2 --operator-kills 10 --seed 7
    .venv/bin/python tests/soak/soak.py --operators 1    # one replica, no leader election
"""

from __future__ import annotations

import argparse
import random
import secrets
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos import Chaos  # noqa: E402
from invariants import FORCE_DELETE_OVERLAP, INVARIANTS, JobHistory, Objects, Violations, steady  # noqa: E402
from leadership import breaks, logged_at  # noqa: E402
from operators import Operators  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SETTLE_SECONDS = 150.0  # the stated bound: every job steady this long after the churn stops
ERROR_LINES = ("Traceback (most recent call last)", "reconcile failed")
QUIET_AFTER = 30.0  # after the churn, errors may still come from its last disruptions; later ones may not


@dataclass
class Config:
    minutes: float = 10.0
    operator_kills: int = 60
    apiserver_restarts: int = 1
    etcd_restarts: int = 1
    lose_node: bool = True
    operators: int = 2  # replicas with --leader-elect on one Lease; 1: a single process without
    seed: int = field(default_factory=lambda: secrets.randbelow(10**6))
    settle_seconds: float = SETTLE_SECONDS


@dataclass
class Report:
    config: Config
    counts: dict[str, int]
    violations: Violations
    churn_seconds: float
    settled_in: float | None

    def total(self) -> int:
        return sum(self.violations.count(name) for name in INVARIANTS)

    def table(self) -> str:
        lines = [f"soak: seed {self.config.seed}, {self.churn_seconds / 60:.1f} min of churn, "
                 f"settled in {f'{self.settled_in:.0f} s' if self.settled_in is not None else 'never'} "
                 f"(bound {self.config.settle_seconds:.0f} s)", "", f"{'operation':<40} {'count':>7}"]
        lines += [f"{name:<40} {count:>7}" for name, count in sorted(self.counts.items())]
        lines += ["", f"{'invariant':<80} {'violations':>10}"]
        lines += [f"{text:<80} {self.violations.count(name):>10}" for name, text in INVARIANTS.items()]
        for name in INVARIANTS:
            for detail in self.violations.seen.get(name, [])[:5]:
                lines.append(f"  {name}: {detail}")
        return "\n".join(lines)


def run(config: Config, api, kubeconfig: Path, namespace: str, workdir: Path) -> Report:
    from kubernetes import client

    from localcluster import restarts

    rng = random.Random(config.seed)
    state_dir = ROOT / ".localcluster"
    gates = Path("/tmp/elasticjob-soak") / namespace
    gates.mkdir(parents=True, exist_ok=True)
    violations = Violations()
    history = JobHistory(api, namespace, violations)
    objects = Objects(api, namespace, state_dir, violations)
    chaos = Chaos(api, namespace, rng, state_dir, gates)
    objects.force_deleted = chaos.force_deleted
    operators = Operators(ROOT, kubeconfig, namespace, workdir, api, config.operators)
    history.start()
    operators.start()
    duration = config.minutes * 60
    schedule = plan_disruptions(config, rng, duration)
    started = time.monotonic()
    def disrupt(what: str) -> None:
        if what == "operator":
            operators.kill(rng)
        elif what == "lose-node":
            nodes = [n.metadata.name for n in client.CoreV1Api(api).list_node().items]
            chaos.lose_node(rng.choice(nodes), for_seconds=70)
        else:
            restarts.restart(ROOT, what, down_seconds=rng.uniform(0, 3), log=lambda line: None)
            chaos.counts[f"{what} restarts"] += 1
            objects.api_restarted_at = time.monotonic()  # invariants.API_RESTART_OVERLAP

    while (elapsed := time.monotonic() - started) < duration:
        while schedule and schedule[0][0] <= elapsed:
            disrupt(schedule.pop(0)[1])
        chaos.step()
        operators.check_alive()
        objects.check(dict(history.latest))
        time.sleep(rng.uniform(0.2, 1.2))
    # A slow last step (a drain, a control-plane restart) can carry the churn past the last ones' moments.
    for _, what in schedule:
        disrupt(what)
    churn = time.monotonic() - started
    chaos.settle()
    quiet_from = datetime.now() + timedelta(seconds=QUIET_AFTER)
    settled_in = settle(config, api, namespace, history, objects, operators, violations)
    codes = operators.stop()
    check_operator(operators, codes, violations, quiet_from)
    if config.operators > 1:
        for key, detail in breaks(operators.incarnations(), namespace):
            violations.add("two-leaders", key, detail)
    history.stop()
    if objects.tolerated:
        chaos.counts[f"overlaps within {FORCE_DELETE_OVERLAP:.0f} s of a force delete"] = len(objects.tolerated)
    return Report(config, dict(chaos.counts + operators.counts), violations, churn, settled_in)


def plan_disruptions(config: Config, rng: random.Random, duration: float) -> list[tuple[float, str]]:
    """When the operator dies and the control plane restarts: spread over the churn, in random order."""
    events = [(rng.uniform(0.02, 0.95) * duration, "operator") for _ in range(config.operator_kills)]
    events += [(rng.uniform(0.2, 0.8) * duration, "apiserver") for _ in range(config.apiserver_restarts)]
    events += [(rng.uniform(0.2, 0.8) * duration, "etcd") for _ in range(config.etcd_restarts)]
    if config.lose_node:
        events.append((rng.uniform(0.1, 0.5) * duration, "lose-node"))
    return sorted(events)


def settle(config: Config, api, namespace: str, history: JobHistory, objects: Objects, operators: Operators,
           violations: Violations) -> float | None:
    from kubernetes import client

    core = client.CoreV1Api(api)
    started = time.monotonic()
    unsteady: list[str] = []
    while time.monotonic() - started < config.settle_seconds:
        operators.check_alive()
        objects.check(dict(history.latest))
        pods = core.list_namespaced_pod(namespace).items
        unsteady = [b["metadata"]["name"] for b in history.latest.values() if not steady(b, pods)]
        if not unsteady:
            return time.monotonic() - started
        time.sleep(1)
    pods = core.list_namespaced_pod(namespace).items
    for name in unsteady:
        body = next(b for b in history.latest.values() if b["metadata"]["name"] == name)
        status = body.get("status") or {}
        mine = [f"{p.metadata.name}:{p.status.phase}{'(deleting)' if p.metadata.deletion_timestamp else ''}"
                f"{'' if any(r.uid == body['metadata']['uid'] for r in p.metadata.owner_references or []) else '(not ours)'}"
                f"@{p.spec.node_name}" for p in pods if (p.metadata.labels or {}).get("elasticjob.dev/job-name") == name]
        violations.add("not-steady", name, f"{name}: {status.get('phase')}/{status.get('reason')}: "
                                           f"{status.get('message')}; pods {mine}")
    return None


def check_operator(operators: Operators, codes: list[int], violations: Violations, quiet_from: datetime) -> None:
    for crash in operators.crashes:
        violations.add("operator-unhealthy", crash, crash)
    for i, code in enumerate(codes):
        if code != 0:
            violations.add("operator-unhealthy", f"exit/{i}", f"a last operator incarnation exited {code} on SIGTERM")
    for name, text in operators.logs_text():
        for line in text.splitlines():
            if "Traceback (most recent call last)" in line:
                violations.add("operator-unhealthy", f"{name}/traceback", f"{name} has a traceback")
    late = [line for _, text in operators.logs_text() for line in text.splitlines()
            if any(e in line for e in ERROR_LINES) and logged_at(line) and logged_at(line) > quiet_from]
    if late:
        violations.add("operator-unhealthy", "settled", f"errors {QUIET_AFTER:.0f}s after the churn stopped "
                                                        f"({len(late)}): {late[-1][:200]}")


def main() -> int:
    from kubernetes import client
    from kubernetes import config as kubeconfig_loader

    from localcluster import controlplane

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--operator-kills", type=int, default=60)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-node-loss", action="store_true")
    parser.add_argument("--operators", type=int, default=2, choices=range(1, 9), metavar="N",
                        help="operator replicas (default 2, leader election on one Lease; 1: one process without)")
    args = parser.parse_args()
    config = Config(minutes=args.minutes, operator_kills=args.operator_kills, lose_node=not args.no_node_loss,
                    operators=args.operators)
    if args.seed is not None:
        config.seed = args.seed
    cluster = controlplane.ensure_up(ROOT, 3)
    api = kubeconfig_loader.new_client_from_config(config_file=str(cluster.kubeconfig))
    namespace = f"soak-{secrets.token_hex(3)}"
    core = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": namespace}})
    import subprocess

    subprocess.run(["kubectl", "--kubeconfig", str(cluster.kubeconfig), "apply", "--server-side", "--force-conflicts",
                    "-f", str(ROOT / "crds")], check=True, capture_output=True)
    workdir = ROOT / ".localcluster" / namespace
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        report = run(config, api, cluster.kubeconfig, namespace, workdir)
    finally:
        core.delete_namespace(namespace, propagation_policy="Background")
    print(report.table())
    print(f"\noperator logs: {workdir}")
    return 1 if report.total() else 0


if __name__ == "__main__":
    sys.exit(main())
