"""Figures that README and docs state twice, or that the code decides, agree with their one source.

Each row names where a figure is stated and where it comes from: the code (the models' defaults, the e2e tests
counted), torch, or the table that records the measurement (docs/benchmarks.md, localcluster/README.md).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from elasticjob.models import RendezvousSpec

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("behaviour/*.md"))]


def text(name: str) -> str:
    return (ROOT / name).read_text()


def recovery_table() -> dict[str, str]:
    """The operator's defaults column of the first recovery table in docs/benchmarks.md: fault -> seconds."""
    rows = {}
    for line in text("docs/benchmarks.md").split("## Recovery after a fault", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 2 and (figure := re.fullmatch(r"\*\*([\d.]+)\*\*.*", cells[1])):
            rows[cells[0]] = figure.group(1)
        elif rows and not line.startswith("|"):
            break
    return rows


def deleted_table() -> dict[str, str]:
    """The "now" column of docs/benchmarks.md's table of pods deleted at once: fault -> seconds."""
    rows = {}
    for line in text("docs/benchmarks.md").split("**Pods deleted at once**", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 3 and (figure := re.fullmatch(r"\*\*([\d.]+)\*\*.*", cells[2])):
            rows[cells[0]] = figure.group(1)
        elif rows and not line.startswith("|"):
            break
    return rows


def test_the_readme_quotes_the_recovery_tables():
    table, deleted = recovery_table(), deleted_table()
    quoted = re.search(r"training again ([\d.]+) s after a worker pod is killed, ([\d.]+) s after rank 0's pod is "
                       r"deleted, ([\d.]+) s after a scale-up", " ".join(text("README.md").split()))
    assert quoted, "README's recovery sentence changed: keep it quoting docs/benchmarks.md"
    assert quoted.groups() == (table["SIGKILL of a worker pod's container"], deleted["rank 0's pod deleted"],
                               table["`kubectl scale` 2 → 3"])


def test_the_time_to_notice_a_lost_node_is_the_defaults_product():
    defaults = RendezvousSpec()
    seconds = defaults.keep_alive_interval_seconds * defaults.keep_alive_max_attempts
    stated = re.findall(r"notice a lost node \(about (\d+) s\)", text("docs/api.md"))
    assert stated == [str(seconds)]


def test_the_collective_timeout_is_torchs():
    """torch's defaults: 10 minutes for NCCL (ProcessGroupNCCL), 30 for the others (default_pg_timeout)."""
    from torch.distributed.constants import default_pg_timeout

    assert default_pg_timeout.total_seconds() == 30 * 60
    for doc in DOCS:
        for mention in re.findall(r"(?:collective timeout:|until its timeout \()[^)]*\)", " ".join(doc.read_text().split())):
            assert "10 minutes with NCCL, 30 with gloo" in mention, f"{doc.name}: {mention}"


def test_the_control_plane_build_time_is_the_build_tables():
    row = next(line for line in text("localcluster/README.md").splitlines()
               if line.startswith("| kube-apiserver, kube-controller-manager"))
    minutes = re.search(r"about (\d+) min", row).group(1)  # type: ignore[union-attr]
    for name in ("README.md", "docs/development.md"):
        stated = re.findall(r"control plane (?:and kubectl )?(?:\()?about (\d+) minutes",
                            " ".join(text(name).split()))
        assert stated == [minutes], name


def e2e_test_functions() -> int:
    return sum(1 for path in (ROOT / "tests" / "e2e").glob("test_*.py") for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))


def test_the_e2e_scenario_count_is_the_tests():
    stated = re.findall(r"every scenario \((\d+) test functions", text("docs/development.md"))
    assert stated == [str(e2e_test_functions())]


@pytest.mark.parametrize("phrase", ["ignored on the local cluster"])
def test_no_stale_claim_in_the_examples(phrase):
    assert not [p.name for p in (ROOT / "examples").rglob("*.yaml") if phrase in p.read_text()]
