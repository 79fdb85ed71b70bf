"""The local cluster's kinds of node behind one seam (localcluster/nodekind.py): which kind a cluster's state
says it runs, that both kinds answer the whole protocol, and that nothing that injects faults branches on the kind."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from localcluster import faults, nodekind, processnodes
from localcluster.layout import Layout
from localcluster.realnodes.kind import RealNodes

ROOT = Path(__file__).resolve().parents[2]


def state_of(tmp_path: Path, *, agent: bool, real_node_dirs: int) -> Path:
    layout = Layout(tmp_path)
    layout.state.mkdir(parents=True)
    if agent:
        layout.pid_file("nodeagent").parent.mkdir(parents=True, exist_ok=True)
        layout.pid_file("nodeagent").write_text("1\n")
    for index in range(real_node_dirs):
        (layout.state / "nodes" / f"local-node-{index}").mkdir(parents=True)
    return layout.state


@pytest.mark.parametrize(("agent", "real_node_dirs", "kind"), [
    (True, 0, "process"),   # the node agent runs
    (True, 3, "process"),   # ... beside the directories an earlier real-node cluster left
    (False, 3, "real"),     # real nodes made (running or lost: a lost node's directory restores it)
    (False, 0, "real"),     # nothing started yet: the default kind
])
def test_the_cluster_state_names_its_kind_of_node(tmp_path, agent, real_node_dirs, kind):
    assert faults.nodes(state_of(tmp_path, agent=agent, real_node_dirs=real_node_dirs)).name == kind


def test_both_kinds_answer_every_fault_of_the_protocol():
    wanted = {name for name, _ in inspect.getmembers(nodekind.NodeKind, inspect.isfunction) if name[0] != "_"}
    assert wanted >= {"kill_pod", "lose_node", "restore_node", "partition", "heal", "throttle", "slow_link",
                      "live_pod_uids"}
    for kind in (processnodes.ProcessNodes, RealNodes):
        missing = {name for name in wanted if not callable(getattr(kind, name, None))}
        assert not missing, f"{kind.__name__} lacks {missing}"
        for name in wanted:
            ours, protocol = inspect.signature(getattr(kind, name)), inspect.signature(getattr(nodekind.NodeKind, name))
            assert list(ours.parameters)[1:] == list(protocol.parameters)[1:], f"{kind.__name__}.{name}"


def test_a_process_backed_node_says_plainly_what_it_cannot_do(tmp_path):
    nodes = processnodes.ProcessNodes(tmp_path)
    with pytest.raises(nodekind.Unsupported, match="real nodes"):
        nodes.throttle("ns", "pod", 20)
    with pytest.raises(nodekind.Unsupported, match="real nodes"):
        nodes.slow_link("ns", "pod", 10)


def test_a_lost_process_backed_node_is_a_marker_the_agent_reads_and_restore_removes(tmp_path):
    nodes = processnodes.ProcessNodes(tmp_path)
    assert nodes.lose_node("local-node-1") == 0  # no pod ran there
    assert processnodes.is_lost("local-node-1", tmp_path) and not processnodes.is_lost("local-node-0", tmp_path)
    nodes.restore_node("local-node-1")
    assert not processnodes.is_lost("local-node-1", tmp_path)


# What injects faults into the local cluster: each does it through faults.nodes(), never by asking which kind runs.
FAULT_INJECTORS = ["localcluster/localcluster/faults.py", "localcluster/localcluster/partition.py",
                   "tests/e2e/e2e_support.py", "tests/soak/invariants.py", "tests/soak/chaos.py", "bench/goodput.py",
                   "bench/recovery.py", "bench/split_brain.py", "bench/steps_lost.py"]
KIND_WORDS = {"real_nodes", "realnodes", "_real", "ProcessNodes", "RealNodes"}


def _kind_imports(tree: ast.AST) -> list[str]:
    """Imports of one kind's fault code (kind's kill may read a pod's container ids through the real nodes'
    helper: kind is another cluster, not a kind of local node)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("localcluster.realnodes") and \
                {a.name for a in node.names} - {"running_containers"}:
            found.append(f"line {node.lineno}: from {node.module} import ...")
        if isinstance(node, ast.ImportFrom) and node.module == "localcluster" and \
                {a.name for a in node.names} & {"realnodes", "processnodes"}:
            found.append(f"line {node.lineno}: from localcluster import {[a.name for a in node.names]}")
    return found


def _top_level_branches(tree: ast.Module) -> list[str]:
    found = []
    for statement in tree.body:
        if isinstance(statement, ast.FunctionDef) and statement.name == "nodes":
            continue
        for each in ast.walk(statement):
            if isinstance(each, ast.If | ast.IfExp):
                words = {n.id for n in ast.walk(each.test) if isinstance(n, ast.Name)}
                words |= {n.attr for n in ast.walk(each.test) if isinstance(n, ast.Attribute)}
                if words & KIND_WORDS:
                    found.append(f"line {each.lineno}: {ast.unparse(each.test)}")
    return found


@pytest.mark.parametrize("path", FAULT_INJECTORS)
def test_no_fault_injector_imports_one_kinds_fault_code(path):
    assert not _kind_imports(ast.parse((ROOT / path).read_text())), path


@pytest.mark.parametrize("path", ["localcluster/localcluster/faults.py", "localcluster/localcluster/partition.py"])
def test_the_fault_library_decides_the_kind_in_one_place(path):
    assert not _top_level_branches(ast.parse((ROOT / path).read_text())), path


def test_the_finders_find_what_faults_py_once_did():
    once = ast.parse("def kill_pod(ns, name, signal, state_dir):\n"
                     "    if (layout := real_nodes(state_dir)) is not None:\n"
                     "        from localcluster.realnodes import faults as real\n"
                     "        return real.kill_containers(None, layout.state, ns, name, signal)\n")
    assert len(_kind_imports(once)) == 1 and len(_top_level_branches(once)) == 1
