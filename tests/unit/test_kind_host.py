"""kind beside the local cluster on one host: Docker's runc wrapper (localcluster/localcluster/runcbounded.py), the
local cluster's FORWARD rules that survive Docker's DROP policy, and the kind configurations and scripts that must
agree with what the project builds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from localcluster import network, runcbounded

ROOT = Path(__file__).resolve().parents[2]
KIND = ROOT / "tests" / "e2e" / "kind"
# This machine's CapBnd: every capability up to CAP_CHECKPOINT_RESTORE but CAP_SYS_RESOURCE (bit 24).
STATUS_WITHOUT_SYS_RESOURCE = "Name:\tpython3\nCapInh:\t0000000000000000\nCapBnd:\t000001fffeffffff\n"
STATUS_FULL = "CapBnd:\t000001ffffffffff\n"
PRIVILEGED = {name: list(runcbounded.CAP_NAMES) for name in ("bounding", "effective", "permitted")}


def test_the_bounding_set_is_read_from_proc_status() -> None:
    assert runcbounded.missing(STATUS_WITHOUT_SYS_RESOURCE) == {"CAP_SYS_RESOURCE"}
    assert runcbounded.missing(STATUS_FULL) == set()
    assert "CAP_SYS_ADMIN" in runcbounded.bounding_set(STATUS_WITHOUT_SYS_RESOURCE)


def test_only_what_the_bounding_set_lacks_is_dropped_and_the_rest_kept_in_order() -> None:
    caps = {**PRIVILEGED, "ambient": [], "other": ["CAP_SYS_RESOURCE"]}
    after = runcbounded.bounded(caps, {"CAP_SYS_RESOURCE"})
    for key in ("bounding", "effective", "permitted"):
        assert after[key] == [c for c in runcbounded.CAP_NAMES if c != "CAP_SYS_RESOURCE"]
    assert after["other"] == ["CAP_SYS_RESOURCE"]  # not a capability set runc reads: left alone
    assert runcbounded.bounded(caps, set()) == caps


@pytest.mark.parametrize(("argv", "expected"), [
    (["--root", "/r", "create", "--bundle", "/b", "--pid-file", "/p", "id"], ("/b/config.json", "process")),
    (["run", "--bundle=/b", "id"], ("/b/config.json", "process")),
    (["exec", "--process", "/tmp/proc.json", "--detach", "id"], ("/tmp/proc.json", "")),
    (["start", "id"], None),
    (["delete", "--force", "id"], None),
])
def test_runc_calls_are_found_where_they_read_capabilities(argv: list[str], expected) -> None:
    found = runcbounded.spec_file(argv)
    assert (None if found is None else (str(found[0]), found[1])) == expected


def test_a_bundle_and_an_exec_process_file_are_rewritten_in_place(tmp_path: Path) -> None:
    bundle = tmp_path / "config.json"
    bundle.write_text(json.dumps({"ociVersion": "1.0", "process": {"args": ["/sbin/init"], "capabilities": PRIVILEGED}}))
    assert runcbounded.rewrite(bundle, "process", {"CAP_SYS_RESOURCE"})
    written = json.loads(bundle.read_text())
    assert "CAP_SYS_RESOURCE" not in written["process"]["capabilities"]["effective"]
    assert written["process"]["args"] == ["/sbin/init"]
    assert not runcbounded.rewrite(bundle, "process", {"CAP_SYS_RESOURCE"})  # nothing left to drop

    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["sh"], "capabilities": PRIVILEGED}))
    assert runcbounded.rewrite(process, "", {"CAP_SYS_RESOURCE"})
    assert "CAP_SYS_RESOURCE" not in json.loads(process.read_text())["capabilities"]["bounding"]
    without = tmp_path / "plain.json"
    without.write_text(json.dumps({"args": ["sh"]}))
    assert not runcbounded.rewrite(without, "", {"CAP_SYS_RESOURCE"})


def test_the_local_bridge_is_accepted_both_ways_whatever_the_forward_policy() -> None:
    assert network.forward_rules("br-x") == [("FORWARD", "-i", "br-x", "-j", "ACCEPT"),
                                              ("FORWARD", "-o", "br-x", "-j", "ACCEPT")]


@pytest.mark.skipif(shutil.which("unshare") is None or shutil.which("iptables") is None,
                    reason="needs unshare and iptables")
def test_forward_rules_are_inserted_once_in_a_namespace_whose_policy_is_drop() -> None:
    """In a network namespace of its own (unshare -n, as root): the policy set to DROP as Docker sets it, the rules
    inserted twice, listed once each."""
    script = ("import subprocess\n"
              "from localcluster import network\n"
              "subprocess.run(['iptables', '-P', 'FORWARD', 'DROP'], check=True)\n"
              "network.accept_forwarding('br-test'); network.accept_forwarding('br-test')\n"
              "print(subprocess.run(['iptables', '-S', 'FORWARD'], capture_output=True, text=True, check=True).stdout)")
    result = subprocess.run(["unshare", "-n", str(ROOT / ".venv" / "bin" / "python"), "-c", script],
                            capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0 and "Operation not permitted" in result.stderr:
        pytest.skip("unshare -n needs root")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "-P FORWARD DROP" in lines
    assert lines.count("-A FORWARD -i br-test -j ACCEPT") == 1
    assert lines.count("-A FORWARD -o br-test -j ACCEPT") == 1


def _configs() -> dict[str, dict]:
    return {name: yaml.safe_load((KIND / name).read_text()) for name in ("kind-config.yaml", "kind-config-offline.yaml")}


def test_both_kind_configs_keep_off_the_local_clusters_subnet_and_match_what_up_sh_routes() -> None:
    up = (KIND / "up.sh").read_text()
    for name, config in _configs().items():
        networking = config["networking"]
        for key in ("podSubnet", "serviceSubnet"):
            assert not networking[key].startswith("10.244."), f"{name}: {key} is the local cluster's"
            assert f"={networking[key]}" in up.replace("_SUBNET=", "="), f"{name}: up.sh does not route {key}"
        assert any("failCgroupV1: false" in patch for patch in config["kubeadmConfigPatches"]), name


def test_the_offline_config_names_the_coredns_the_node_image_carries_and_its_cni_subnet() -> None:
    offline = _configs()["kind-config-offline.yaml"]
    assert offline["networking"]["disableDefaultCNI"] is True
    pinned = re.search(r"\[coredns\]=github.com/coredns/coredns@(v[0-9.]+)", (ROOT / "localcluster" / "build.sh").read_text())
    assert pinned, "build.sh pins no CoreDNS"
    assert any(f"imageTag: {pinned[1]}" in patch for patch in offline["kubeadmConfigPatches"])
    script = (KIND / "node-image.sh").read_text()
    first_24 = re.search(r'POD_SUBNET_24="\$\{KIND_POD_SUBNET_24:-([0-9./]+)\}"', script)
    assert first_24 and first_24[1] == offline["networking"]["podSubnet"].replace("/16", "/24")


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is a host package (make host-packages)")
def test_the_kind_scripts_pass_shellcheck() -> None:
    scripts = [KIND / "up.sh", KIND / "down.sh", KIND / "node-image.sh", ROOT / "localcluster" / "container-engine.sh"]
    result = subprocess.run(["shellcheck", "-S", "warning", *map(str, scripts)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stdout
