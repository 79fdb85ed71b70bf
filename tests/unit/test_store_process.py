"""The tests' way of starting a store survives losing its port pair between the pick and the bind."""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path

import pytest

import store_process
from elasticjob_store.protocol import control_port
from store_process import StoreExited, start_store_process

ROOT = Path(__file__).resolve().parents[2]
STANDIN = [sys.executable, "-m", "localcluster.storestandin"]


def healthy(port: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{control_port(port)}/healthz", timeout=1):
        return True


@pytest.fixture
def taken_pair():
    """A pair another process holds: its control port is bound and listening."""
    port = store_process.free_port_pair()
    with socket.socket() as holder:
        holder.bind(("", control_port(port)))
        holder.listen()
        yield port


def test_a_pair_taken_after_the_pick_is_replaced_by_another(monkeypatch, tmp_path, taken_pair):
    picks = iter([taken_pair])
    real = store_process.free_port_pair
    monkeypatch.setattr(store_process, "free_port_pair", lambda: next(picks, None) or real())
    proc, port = start_store_process(STANDIN, {"PATH": str(Path(sys.executable).parent)}, tmp_path / "log", healthy,
                                     cwd=ROOT)
    try:
        assert port != taken_pair
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_store_that_exits_for_another_reason_fails_at_once_with_its_output(tmp_path):
    command = [sys.executable, "-c", "import sys; print('no such thing'); sys.exit(3)"]
    with pytest.raises(StoreExited, match="exited 3 before it served:\nno such thing"):
        start_store_process(command, {}, tmp_path / "log", healthy, timeout=30)


def test_pairs_are_drawn_outside_the_kernels_own_range():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(store_process.free_port_pair() + 1 < low for _ in range(20))
