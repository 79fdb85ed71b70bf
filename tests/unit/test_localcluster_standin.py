"""The light rendezvous stand-in (localcluster/storestandin.py): the operator's own client reads it as a store,
with the real store's long-poll semantics, and the node maps its image to it."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from elasticjob import builders
from elasticjob.rendezvous_client import StoreClient
from elasticjob.store_reply import parse_state
from elasticjob_store.auth import Credential
from elasticjob_store.protocol import control_port
from localcluster import containers, images, storestandin
from store_process import start_store_process

ROOT = Path(__file__).resolve().parents[2]
KEY = b"k" * 32
UID = "6f1c2b8e-0000-4000-8000-000000000001"


@pytest.fixture
def standin(tmp_path):
    digest = builders.token_digest(StoreClient(KEY).token(UID))
    server = storestandin.make_server("127.0.0.1", 0, Credential(digest=digest), UID, 1, 4)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def state(server, **kwargs):
    async def read():
        client = StoreClient(KEY)
        try:
            return await client.state("127.0.0.1", server.server_address[1], UID, **kwargs)
        finally:
            await client.close()
    return asyncio.run(read())


def test_the_operator_parses_its_state_as_a_store_no_agent_wrote_to(standin):
    view = state(standin)
    assert view is not None
    assert (view.epoch, view.version, view.round, view.participants, view.failure_rounds) == \
        (standin.epoch, 0, None, (), 0)


def test_a_long_poll_is_held_for_its_wait_when_nothing_changed(standin):
    started = time.monotonic()
    view = state(standin, after=0, epoch=standin.epoch, wait=0.3)
    assert view is not None and time.monotonic() - started >= 0.3


@pytest.mark.parametrize("after, epoch", [(-1, None), (0, "0123abcd")])
def test_a_long_poll_answers_at_once_for_a_new_reader_or_another_epoch(standin, after, epoch):
    """As the real store: version passed `after`, or the epoch is not this process's (it restarted)."""
    started = time.monotonic()
    view = state(standin, after=after, epoch=epoch or standin.epoch, wait=5)
    assert view is not None and time.monotonic() - started < 2


def test_without_the_token_only_healthz_answers(standin):
    base = f"http://127.0.0.1:{standin.server_address[1]}"
    assert urllib.request.urlopen(f"{base}/healthz", timeout=5).read() == b"ok"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{base}/v1/state", timeout=5)
    assert refused.value.code == 401
    assert parse_state(b'{"epoch": "not hex"}') is None  # (the parser the operator uses is strict)


def test_its_image_runs_the_stand_in_whatever_the_container_names():
    """The store pod's command is `python -m elasticjob_store`; the stand-in image replaces it."""
    image = images.config_for(f"{storestandin.IMAGE}:latest", ROOT)
    container = {"name": "rendezvous", "command": ["python", "-m", "elasticjob_store"]}
    assert containers.command_line(container, {}, image) == ["python", "-m", "localcluster.storestandin"]
    assert containers.command_line(container, {}, images.config_for("elasticjob-worker:cpu", ROOT)) == \
        ["python", "-m", "elasticjob_store"]


def test_the_program_starts_light_and_serves(tmp_path):
    """Without torch: the stand-in serves and its process never maps torch (the real store imports it)."""
    env = {"PATH": str(Path(sys.executable).parent), "ELASTICJOB_RDZV_TOKEN_SHA256": builders.token_digest("t")}

    def healthy(port: int) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{control_port(port)}/healthz", timeout=1):
            return True

    proc, _ = start_store_process([sys.executable, "-m", "localcluster.storestandin"], env, tmp_path / "standin.log",
                                  healthy, cwd=ROOT)
    try:
        assert "torch" not in Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0

