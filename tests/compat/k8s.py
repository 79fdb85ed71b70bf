"""`make compat-k8s`: the core e2e scenarios on real nodes of each supported Kubernetes minor, one row each.

Usage: python tests/compat/k8s.py [--versions 1.33,1.37] [--markdown]
For each minor: its control plane, kubelet, kube-proxy and kubectl are built (once, cached per version by
localcluster/build.sh), a fresh cluster of real nodes with Kueue is started, the operator is installed by its chart
with the defaults, and the scenarios below run: a plain job trained to Succeeded, a kill of rank 0's pod, a scale
down, a queued job admitted by Kueue and trained to Succeeded, and a queued job that grows through a workload
slice. The cluster is stopped before the next minor. A minor that cannot be built is a row that says so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from compat_table import table

ROOT = Path(__file__).resolve().parents[2]
LOGS = Path(os.environ.get("COMPAT_CACHE", Path.home() / ".cache" / "elasticjob" / "compat")) / "k8s"
VERSIONS = ("1.33", "1.34", "1.35", "1.36", "1.37")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
# scenario -> the e2e tests that show it (node ids under tests/e2e/)
SCENARIOS = {
    "plain job to Succeeded": ["test_training.py::test_start_runs_to_success"],
    "kill rank 0": ["test_training.py::test_sigkill_of_the_rank0_pod_keeps_training"],
    "scale down": ["test_training.py::test_scale_downs_cost_nothing_and_lose_no_step"],
    "queued job (Kueue)": ["test_kueue_training.py::test_the_second_job_waits_queued_until_the_first_finishes"],
    "scale up by a slice (Kueue)": [
        "test_kueue_training.py::test_a_training_job_grows_through_a_workload_slice_once_kueue_admits_it"],
}


def run_version(version: str) -> dict[str, str]:
    LOGS.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ELASTICJOB_K8S_VERSION=version, LOCALCLUSTER_NODE_KIND="real")
    report = LOGS / f"junit-{version}.xml"
    report.unlink(missing_ok=True)
    with open(LOGS / f"run-{version}.log", "w") as log:
        built = subprocess.run(["make", "cluster-build", f"K8S_VERSION={version}"], cwd=ROOT, env=env,
                               stdout=log, stderr=log)
        if built.returncode != 0:
            return {name: "not buildable" for name in SCENARIOS}
        wanted = [f"tests/e2e/{node}" for ids in SCENARIOS.values() for node in ids]
        try:
            subprocess.run([PYTHON, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}",
                            *wanted], cwd=ROOT, env=env, stdout=log, stderr=log)
        finally:
            subprocess.run([PYTHON, "-m", "localcluster", "down"], cwd=ROOT, env=env, stdout=log, stderr=log)
    return cells(report) if report.exists() else {name: "did not run" for name in SCENARIOS}


def cells(report: Path) -> dict[str, str]:
    outcome: dict[str, list[tuple[str, float]]] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}.py::{case.get('name', '').split('[')[0]}"
        result = ("FAIL" if case.find("failure") is not None or case.find("error") is not None
                  else "skip" if case.find("skipped") is not None else "ok")
        outcome.setdefault(test, []).append((result, float(case.get("time") or 0)))
    table = {}
    for name, ids in SCENARIOS.items():
        results = [r for i in ids for r in outcome.get(i, [])]
        ran = [(r, t) for r, t in results if r != "skip"]
        seconds = sum(t for _, t in ran)
        table[name] = ("FAIL" if any(r == "FAIL" for r, _ in ran) else f"ok ({seconds:.0f} s)" if ran
                       else "skipped" if results else "did not run")
    return table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = {}
    for version in args.versions.split(","):
        print(f"Kubernetes {version}: running (log: {LOGS / f'run-{version}.log'})", flush=True)
        started = time.monotonic()
        rows[version] = run_version(version)
        print(f"Kubernetes {version}: done in {time.monotonic() - started:.0f} s: {rows[version]}", flush=True)
    print(render(rows, args.markdown))
    return 0 if all(cell.startswith("ok") for row in rows.values() for cell in row.values()) else 1


def render(rows: dict[str, dict[str, str]], markdown: bool) -> str:
    header = ["Kubernetes", *SCENARIOS]
    lines = [[version, *row.values()] for version, row in rows.items()]
    return table(header, lines, markdown)


if __name__ == "__main__":
    sys.exit(main())
