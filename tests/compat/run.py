"""`make compat`: the rendezvous scenarios as local processes against each torch version, one cached virtual
environment per version under ~/.cache/elasticjob/compat/, and a table of version x behaviour.

Usage: python tests/compat/run.py [--versions 2.6.0,2.13.0] [--markdown]
Each version's environment has torch, psutil and pytest; the operator's store and wrapper come from the tree
(PYTHONPATH). Versions outside elasticjob_store.compat.SUPPORTED are run too, expecting the degraded path.
A version that cannot be installed or run is a row that says so.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "operator"))
from compat_table import table  # noqa: E402  (beside this script)

from elasticjob_store.compat import in_range  # noqa: E402  (the tree's own range)

CACHE = Path(os.environ.get("COMPAT_CACHE", Path.home() / ".cache" / "elasticjob" / "compat"))
WHEELS = Path(os.environ.get("WHEELS", ROOT.parent / "shared" / "wheels"))
VERSIONS = ("2.5.1", "2.6.0", "2.7.1", "2.9.1", "2.11.0", "2.13.0")
TESTS = "tests"
# behaviour -> the tests that show it (node ids under tests/)
BEHAVIOURS = {
    "store check": ["compat/scenarios.py::test_the_store_check_agrees_with_the_range"],
    "state + nudges on a real TCPStore": ["unit/test_store_server.py"],
    "3 agents, kill, remove + end last call": [
        "integration/test_store_agents.py::test_killed_node_removed_and_round_completed_at_once"],
    "frozen peer, restart nudge": ["integration/test_store_agents.py::test_frozen_node_removed_and_group_restarted"],
    "off: no nudges, torch recovers alone": [
        "compat/scenarios.py::test_outside_the_range_the_store_refuses_nudges_and_torch_recovers_alone"],
    "wrapper check": ["compat/scenarios.py::test_the_wrapper_check_agrees_with_the_range"],
    "warm restart (gloo)": ["compat/scenarios.py::test_a_failed_worker_restarts_from_the_warm_server"],
    "polling patch": ["unit/test_warm_polling.py"],
    "degraded path forced": ["unit/test_store_compat.py", "unit/test_warm_compat.py"],
}
ONLY_ON = {"state + nudges on a real TCPStore", "3 agents, kill, remove + end last call",
           "frozen peer, restart nudge", "polling patch"}


def environment(version: str, log) -> Path:
    """The version's virtual environment, made once; raises CalledProcessError when it cannot be had."""
    venv = CACHE / f"venv-{version}"
    python = venv / "bin" / "python"
    marker = venv / ".compat-ready"
    if marker.exists():
        return python
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, stdout=log, stderr=log)
    local = ["--find-links", str(WHEELS)] if list(WHEELS.glob(f"torch-{version}*.whl")) else []
    started = time.monotonic()
    subprocess.run([str(python), "-m", "pip", "install", "-q", *local, f"torch=={version}", "psutil", "pytest"],
                   check=True, stdout=log, stderr=log)
    size = subprocess.run(["du", "-sh", str(venv)], capture_output=True, text=True).stdout.split()[0]
    print(f"  torch {version}: installed in {time.monotonic() - started:.0f} s, environment {size}", flush=True)
    marker.touch()
    return python


def run_version(version: str) -> dict[str, str]:
    (CACHE / "logs").mkdir(parents=True, exist_ok=True)
    with open(CACHE / "logs" / f"run-{version}.log", "w") as log:
        try:
            python = environment(version, log)
        except subprocess.CalledProcessError:
            return {name: "not installable" for name in BEHAVIOURS}
        on = in_range(version)
        wanted = [n for name, ids in BEHAVIOURS.items() if on or name not in ONLY_ON for n in ids]
        report = CACHE / "logs" / f"junit-{version}.xml"
        env = dict(os.environ, COMPAT_EXPECT="on" if on else "off", PYTHONPATH=os.pathsep.join(
            str(ROOT / p) for p in ("operator", "tests", "tests/integration", "tests/unit")))
        subprocess.run([str(python), "-m", "pytest", "--noconftest", "-p", "no:cacheprovider", "-q", "-s",
                        f"--junitxml={report}", *wanted], cwd=ROOT / TESTS, env=env, stdout=log, stderr=log)
    return cells(report, on) if report.exists() else {name: "did not run" for name in BEHAVIOURS}


def cells(report: Path, on: bool) -> dict[str, str]:
    outcome: dict[str, list[str]] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        path = case.get("classname", "").removeprefix("tests.").replace(".", "/") + ".py"
        result = ("FAIL" if case.find("failure") is not None or case.find("error") is not None
                  else "skip" if case.find("skipped") is not None else "ok")
        outcome.setdefault(path, []).append(result)
        outcome.setdefault(f"{path}::{case.get('name', '').split('[')[0]}", []).append(result)
    table = {}
    for name, ids in BEHAVIOURS.items():
        if not on and name in ONLY_ON:
            table[name] = "off"
            continue
        results = [r for i in ids for r in outcome.get(i, [])]
        ran = [r for r in results if r != "skip"]
        passed = "ok" if on else "ok, off"  # outside the range a pass shows the degraded path working
        table[name] = "FAIL" if "FAIL" in ran else f"{passed} ({len(ran)})" if len(ran) > 1 else passed if ran \
            else "n/a"
    return table


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--versions", default=",".join(VERSIONS))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = {}
    for version in args.versions.split(","):
        print(f"torch {version}: running (log: {CACHE / 'logs' / f'run-{version}.log'})", flush=True)
        started = time.monotonic()
        rows[version] = run_version(version)
        print(f"torch {version}: done in {time.monotonic() - started:.0f} s", flush=True)
    print(render(rows, args.markdown))
    return 1 if any("FAIL" in cell or "did not" in cell for row in rows.values() for cell in row.values()) else 0


def render(rows: dict[str, dict[str, str]], markdown: bool) -> str:
    header = ["torch", "range", *BEHAVIOURS]
    lines = [[v, "in" if in_range(v) else "out", *row.values()] for v, row in rows.items()]
    return table(header, lines, markdown)


if __name__ == "__main__":
    sys.exit(main())
