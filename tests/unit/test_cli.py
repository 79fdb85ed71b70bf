"""The operator's command line: bad values are refused with a clear message, not bent into range."""

from __future__ import annotations

import pytest

from elasticjob import cli
from elasticjob.cli import parse_args


def test_concurrent_reconciles_defaults_to_the_api_pool_size_and_takes_a_positive_count():
    assert parse_args(["run"]).concurrent_reconciles == 32
    assert parse_args(["run", "--concurrent-reconciles", "4"]).concurrent_reconciles == 4


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_concurrent_reconciles_below_one_or_not_a_number_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        parse_args(["run", "--concurrent-reconciles", value])
    assert "--concurrent-reconciles" in capsys.readouterr().err


def test_a_rendezvous_key_file_shorter_than_32_bytes_stops_the_operator_at_start(tmp_path):
    short = tmp_path / "key"
    short.write_bytes(b"k" * 31 + b"\n")
    with pytest.raises(SystemExit, match="key is 31 bytes; at least 32 are needed"):
        cli.rendezvous_key(str(short))
    short.write_bytes(b"k" * 32)
    assert cli.rendezvous_key(str(short)) == b"k" * 32


def test_leader_election_is_off_by_default_and_competes_for_the_named_lease_in_the_operators_namespace(tmp_path):
    key = tmp_path / "key"
    key.write_bytes(b"k" * 48)
    common = ["run", "--rendezvous-key-file", str(key), "--operator-namespace", "ops"]
    assert cli.run_config(parse_args(common)).leader is None
    where = cli.run_config(parse_args([*common, "--leader-elect", "--leader-lease-name", "ej"])).leader
    assert where is not None and (where.name, where.namespace) == ("ej", "ops")
    assert where.identity.startswith("elasticjob-")  # the pod's name (its hostname) and a random part


def test_leader_election_without_the_operators_namespace_stops_at_start(tmp_path, monkeypatch):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(SystemExit, match="--leader-elect needs the operator's namespace"):
        cli.run_config(parse_args(["run", "--leader-elect"]))


def test_tainting_bad_nodes_is_off_unless_asked_for(tmp_path):
    key = tmp_path / "key"
    key.write_bytes(b"k" * 48)
    common = ["run", "--rendezvous-key-file", str(key)]
    assert cli.run_config(parse_args(common)).settings.taint_bad_nodes is False
    assert cli.run_config(parse_args([*common, "--taint-bad-nodes"])).settings.taint_bad_nodes is True
