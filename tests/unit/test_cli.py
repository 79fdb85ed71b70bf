"""The operator's command line: bad values are refused with a clear message, not bent into range."""

from __future__ import annotations

import pytest

from elasticjob.cli import parse_args


def test_concurrent_reconciles_defaults_to_the_api_pool_size_and_takes_a_positive_count():
    assert parse_args(["run"]).concurrent_reconciles == 32
    assert parse_args(["run", "--concurrent-reconciles", "4"]).concurrent_reconciles == 4


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_concurrent_reconciles_below_one_or_not_a_number_is_refused(value, capsys):
    with pytest.raises(SystemExit):
        parse_args(["run", "--concurrent-reconciles", value])
    assert "--concurrent-reconciles" in capsys.readouterr().err
