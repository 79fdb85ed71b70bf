"""The stranger's writes of the store e2e test (tests/e2e/intruder.py), here against a loopback TCPStore: each
lands on a store with no gate (so the e2e's "refused" means the fence, not a write that never worked), none
lands through the gate (elasticjob_store/gate.py) from an address the operator never named, and the store's
decoder refuses the bomb and reads the closed state for what it is."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist
from test_store_gate import free_port, outside_address

from elasticjob_store import gate
from elasticjob_store.state import StateError, decode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
import intruder  # noqa: E402

RUN_ID = "uid-1"
KEYS = [f"torch.rendezvous.{RUN_ID}", "elasticjob.stop.1", "elasticjob.stop.2", "elasticjob.stops"]


def test_every_write_lands_on_a_store_without_a_gate():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    seen = {name: intruder.attempt("127.0.0.1", store.port, write) for name, write in intruder.writes(RUN_ID).items()}
    assert seen == dict.fromkeys(intruder.writes(RUN_ID), "written")
    assert int(store.add("elasticjob.stops", 0)) == 1001  # the forged stop's 1 and the jump's 1000
    assert store.get("elasticjob.stop.2").startswith(b"[[[")


def test_no_write_lands_through_the_gate_from_an_address_it_was_not_told(monkeypatch):
    monkeypatch.setattr(intruder, "SECONDS", 1.0)
    inner = gate.inner_socket()
    store = dist.TCPStore("127.0.0.1", inner.getsockname()[1], is_master=True, wait_for_workers=False,
                          multi_tenant=True, master_listen_fd=inner.fileno(), timeout=timedelta(seconds=5))
    fence = gate.Gate(free_port(), inner.getsockname()[1], hold=0.5, log=lambda _: None)
    fence.start()
    fence.allow(["10.0.0.7"])  # the job's pods are elsewhere
    seen = {name: intruder.attempt(outside_address(), fence.port, write)
            for name, write in intruder.writes(RUN_ID).items()}
    assert all(result.startswith("refused: ") for result in seen.values()), seen
    assert not any(store.check([key]) for key in KEYS)
    assert fence.report()["refused"] >= len(seen)


def test_the_decoder_refuses_the_bomb_and_reads_the_closed_state():
    with pytest.raises(StateError):
        decode(intruder.memo_bomb())
    state = decode(intruder.closed_state())
    assert state is not None and state.closed and len(state.wait_list) == 1


def test_the_program_prints_every_writes_outcome_as_one_json_line(capsys):
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    intruder.main(["127.0.0.1", str(store.port), RUN_ID])
    import json

    assert json.loads(capsys.readouterr().out) == dict.fromkeys(intruder.writes(RUN_ID), "written")
