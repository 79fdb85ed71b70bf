"""The local nodes' known images (the entrypoint a Dockerfile declares) and liveness probes, as pure logic."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from localcluster import containers, images, probes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("ref, name", [
    ("elasticjob-operator", "elasticjob-operator"),
    ("elasticjob-operator:0.1.0", "elasticjob-operator"),
    ("registry.example:5000/team/elasticjob-operator:dev", "elasticjob-operator"),
    ("ghcr.io/x/elasticjob-operator@sha256:abc", "elasticjob-operator"),
    ("elasticjob-worker:cpu", "elasticjob-worker"),
])
def test_image_name(ref, name):
    assert images.image_name(ref) == name


def test_the_operator_image_runs_what_its_dockerfile_declares():
    """Read from images/operator.Dockerfile itself: the file that builds the real image."""
    config = images.config_for("registry.example/elasticjob-operator:0.1.0", ROOT)
    assert config.entrypoint == ("elasticjob", "run")
    assert config.cmd[:2] == ("--all-namespaces", "--liveness")
    assert config.env["PYTHONUNBUFFERED"] == "1"
    assert images.config_for("elasticjob-worker:cpu", ROOT) is None


def test_dockerfile_parsing_takes_the_last_stage_and_its_continuations():
    text = """
FROM python AS build
ENTRYPOINT ["wrong"]
ENV WRONG=1
FROM python:3.11-slim
# a comment
ENV A=1 \\
    B="two words"
ENV LEGACY some value
ENV C=${A}x
CMD ["--flag", \\
     "value"]
ENTRYPOINT ["tool", "run"]
"""
    config = images.parse_dockerfile(text)
    assert config.entrypoint == ("tool", "run")
    assert config.cmd == ("--flag", "value")
    assert config.env == {"A": "1", "B": "two words", "LEGACY": "some value", "C": "1x"}
    assert images.parse_dockerfile("FROM x\nCMD python -m app\n").cmd == ("/bin/sh", "-c", "python -m app")


IMAGE = images.ImageConfig(entrypoint=("elasticjob", "run"), cmd=("--all-namespaces",))


@pytest.mark.parametrize("container, image, argv", [
    # Kubernetes: args replace the image's CMD, command replaces its ENTRYPOINT (and drops CMD).
    ({"args": ["--namespace", "a"]}, IMAGE, ["elasticjob", "run", "--namespace", "a"]),
    ({}, IMAGE, ["elasticjob", "run", "--all-namespaces"]),
    ({"command": ["python", "-m", "x"]}, IMAGE, ["python", "-m", "x"]),
    ({"command": ["python"], "args": ["-V"]}, IMAGE, ["python", "-V"]),
    # Any other image has no entrypoint here: args alone are the command, as before.
    ({"args": ["python", "-V"]}, None, ["python", "-V"]),
])
def test_command_line_follows_the_image(container, image, argv):
    assert containers.command_line({"name": "c", **container}, {}, image) == argv


def test_a_container_with_nothing_to_run_is_refused():
    with pytest.raises(ValueError, match="no command or args"):
        containers.command_line({"name": "c"}, {}, None)


def test_liveness_fails_after_failure_threshold_in_a_row():
    live = probes.Liveness({"httpGet": {"port": 1}, "failureThreshold": 3, "periodSeconds": 1})
    assert live.due()
    assert [live.record(ok) for ok in (False, False, True, False, False)] == [False] * 5  # a pass resets the count
    assert live.record(False) is True
    assert live.next_at > time.monotonic()


def test_liveness_waits_for_its_initial_delay_and_none_means_never():
    assert not probes.Liveness({"httpGet": {"port": 1}, "initialDelaySeconds": 60}).due()
    assert not probes.Liveness(None).due()


def test_http_probe_reports_the_status_code(tmp_path):
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/ok" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert probes.check({"httpGet": {"port": port, "path": "/ok"}}, {}, "127.0.0.1", None, {}) is None
        failed = probes.check({"httpGet": {"port": "health", "path": "/bad"}},
                              {"ports": [{"name": "health", "containerPort": port}]}, "127.0.0.1", None, {})
        assert failed == "HTTP probe failed with statuscode: 503"
    finally:
        server.shutdown()
