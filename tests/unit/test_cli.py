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
