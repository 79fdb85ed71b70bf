"""The slice of the kubelet API that `kubectl logs` needs: GET /containerLogs/{ns}/{pod}/{container}.

The apiserver proxies `kubectl logs` to the node's InternalIP:daemonEndpoints port. All local nodes share one IP,
so each node gets its own port (10250 + index). TLS uses a serving cert signed by the cluster CA; clients must present
a cert signed by that CA, so only the apiserver (its kubelet-client cert) and admins get in.
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from . import launcher, podlogs, state

log = logging.getLogger(__name__)
BASE_PORT = 10250


def serving_cert(state_dir: Path, ip: str) -> tuple[Path, Path]:
    """Signed by the cluster CA when there is one (the apiserver may verify kubelets), else self-signed."""
    pki, out = Path(state_dir) / "pki", Path(state_dir) / "kubelet"
    crt, key, csr = out / "serving.crt", out / "serving.key", out / "serving.csr"
    if crt.exists():
        return crt, key
    out.mkdir(parents=True, exist_ok=True)
    subject, san = "/CN=localcluster-kubelet", f"subjectAltName=IP:{ip}"
    if (pki / "ca.key").exists():
        openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", subject)
        ext = out / "serving.ext"
        ext.write_text(f"basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n{san}\n")
        openssl("x509", "-req", "-in", csr, "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key", "-CAcreateserial",
                "-days", "365", "-sha256", "-extfile", ext, "-out", crt)
    else:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365", "-keyout", key, "-out", crt,
                "-subj", subject, "-addext", san)
    return crt, key


def openssl(*args) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def handler_for(state_dir: Path):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the http.server naming
            url = urlparse(self.path)
            parts = url.path.strip("/").split("/")
            if len(parts) != 4 or parts[0] != "containerLogs":
                self.send_error(404, "only /containerLogs/{namespace}/{pod}/{container} is served")
                return
            _, ns, pod, container = parts
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                pod_dir = podlogs.find_pod_dir(state_dir, ns, pod)
            except FileNotFoundError as exc:
                self.send_error(404, str(exc))
                return
            previous = query.get("previous") == "true"
            path = state.previous_log_file(pod_dir, container) if previous else state.log_file(pod_dir, container)
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            text = path.read_bytes() if path.exists() else b""
            if "tailLines" in query:
                text = b"".join(text.splitlines(keepends=True)[-int(query["tailLines"]):])
            self.wfile.write(text)
            if query.get("follow") == "true" and not previous:
                self.follow(path, path.stat().st_size if path.exists() else 0, state.pid_file(pod_dir, container))

        def follow(self, path: Path, offset: int, pid_file: Path) -> None:
            while True:
                size = path.stat().st_size if path.exists() else 0
                if size > offset:
                    with open(path, "rb") as f:
                        f.seek(offset)
                        self.wfile.write(f.read(size - offset))
                        self.wfile.flush()
                    offset = size
                elif not launcher.signal_container(pid_file, 0):
                    return  # the container is gone and everything it wrote is sent
                else:
                    time.sleep(0.5)  # polling a growing file

        def log_message(self, fmt: str, *args) -> None:
            log.debug("kubelet api: " + fmt, *args)

    return Handler


def serve(state_dir: Path, ip: str, node_count: int, ca_file: Path | None) -> list[ThreadingHTTPServer]:
    crt, key = serving_cert(state_dir, ip)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(crt, key)
    if ca_file and ca_file.exists():
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cafile=str(ca_file))
    servers = []
    for index in range(node_count):
        server = ThreadingHTTPServer((ip, node_port(index)), handler_for(Path(state_dir)))
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name=f"kubelet-api-{index}", daemon=True).start()
        servers.append(server)
    return servers


def node_port(index: int) -> int:
    return BASE_PORT + index
