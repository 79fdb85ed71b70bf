"""A userspace kube-proxy: for every TCP port of every ClusterIP Service, listen on ClusterIP:port (the ClusterIP
added to the host's `lo`) and forward each connection to a ready endpoint from the Service's EndpointSlices,
round-robin.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
from collections.abc import Iterable

from kubernetes import client

from . import kube
from .network import LoopbackIps

log = logging.getLogger(__name__)
SERVICE_LABEL = "kubernetes.io/service-name"


def service_ports(svc: dict) -> list[tuple[str, int, str]]:
    """(clusterIP, port, port name) for each TCP port of a ClusterIP Service; empty for headless or other types."""
    spec = svc.get("spec") or {}
    ip = spec.get("clusterIP")
    if not ip or ip == "None" or spec.get("type", "ClusterIP") not in ("ClusterIP", "NodePort", "LoadBalancer"):
        return []
    return [(ip, p["port"], p.get("name", "")) for p in spec.get("ports") or [] if p.get("protocol", "TCP") == "TCP"]


def slice_backends(slice_: dict) -> dict[str, list[tuple[str, int]]]:
    """Port name -> ready (ip, port) pairs of one EndpointSlice."""
    ready = [a for ep in slice_.get("endpoints") or []
             if (ep.get("conditions") or {}).get("ready") is not False for a in ep.get("addresses") or []]
    return {p.get("name") or "": [(ip, p["port"]) for ip in ready]
            for p in slice_.get("ports") or [] if p.get("protocol", "TCP") == "TCP"}


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


class Listener(threading.Thread):
    def __init__(self, ip: str, port: int, backends):
        super().__init__(name=f"proxy-{ip}:{port}", daemon=True)
        self.backends = backends  # () -> list of (ip, port)
        self.counter = itertools.count()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen(128)
        self.sock.settimeout(0.5)
        self.closed = threading.Event()

    def run(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                break  # closed
            threading.Thread(target=self.forward, args=(conn,), daemon=True).start()

    def forward(self, conn: socket.socket) -> None:
        targets = self.backends()
        start = next(self.counter)
        for i in range(len(targets)):
            target = targets[(start + i) % len(targets)]
            try:
                upstream = socket.create_connection(target, timeout=3)
            except OSError:
                continue
            upstream.settimeout(None)
            conn.settimeout(None)
            threading.Thread(target=pump, args=(upstream, conn), daemon=True).start()
            pump(conn, upstream)
            return
        conn.close()  # no ready endpoint: refuse, as kube-proxy's REJECT does

    def close(self) -> None:
        # Closed here, not by the accept loop, so a new Service on the same ClusterIP:port can bind at once.
        self.closed.set()
        self.sock.close()


def elsewhere(slices: Iterable[dict], own_nodes: set[str]) -> set[tuple[str, str]]:
    """Services (namespace, name) whose endpoints all run on nodes of no agent here (kwok's fake nodes): no
    process answers behind them, so they get no listener. At fleet size (a store Service per job) listening for
    them cost a thread per port and per connection, which starved the machine."""
    nodes: dict[tuple[str, str], set[str | None]] = {}
    for slice_ in slices:
        owner = (slice_["metadata"].get("namespace", ""), (slice_["metadata"].get("labels") or {}).get(SERVICE_LABEL))
        nodes.setdefault(owner, set()).update(ep.get("nodeName") for ep in slice_.get("endpoints") or [])
    return {owner for owner, names in nodes.items() if names and not names & own_nodes and None not in names}


class ServiceProxy:
    def __init__(self, api: client.ApiClient, lo: LoopbackIps, stop: threading.Event, own_nodes: set[str]):
        self.core, self.discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
        self.lo, self.stop, self.own_nodes = lo, stop, own_nodes
        self.lock = threading.Lock()
        self.sync_lock = threading.Lock()  # both watch threads call sync()
        self.services: dict[tuple[str, str], dict] = {}
        self.slices: dict[tuple[str, str], dict] = {}
        self.listeners: dict[tuple[str, int], Listener] = {}

    def start(self) -> None:
        for name, call, table in (("services", self.core.list_service_for_all_namespaces, self.services),
                                  ("slices", self.discovery.list_endpoint_slice_for_all_namespaces, self.slices)):
            threading.Thread(target=kube.watch_forever, name=f"watch-{name}", daemon=True,
                             args=(call, self.on_event(table), self.on_list(table), self.stop)).start()
        threading.Thread(target=self.resync, name="proxy-resync", daemon=True).start()

    def resync(self) -> None:
        """Retries what failed (a port still bound, a ClusterIP not yet on lo) without waiting for an event."""
        while not self.stop.wait(5):
            self.sync()

    def on_list(self, table: dict):
        def handle(items: list[dict]) -> None:
            with self.lock:
                table.clear()
                table.update({key(o): o for o in items})
            self.sync()
        return handle

    def on_event(self, table: dict):
        def handle(kind: str, obj: dict) -> None:
            with self.lock:
                if kind == "DELETED":
                    table.pop(key(obj), None)
                else:
                    table[key(obj)] = obj
            self.sync()
        return handle

    def backends(self, ns: str, svc: str, port_name: str) -> list[tuple[str, int]]:
        with self.lock:
            result = []
            for (slice_ns, _), sl in self.slices.items():
                if slice_ns == ns and (sl["metadata"].get("labels") or {}).get(SERVICE_LABEL) == svc:
                    result += slice_backends(sl).get(port_name, [])
            return result

    def sync(self) -> None:
        with self.sync_lock:
            self.apply()

    def apply(self) -> None:
        with self.lock:
            skipped = elsewhere(self.slices.values(), self.own_nodes)
            wanted = {(ip, port): (ns, name, pname) for (ns, name), svc in self.services.items()
                      if (ns, name) not in skipped for ip, port, pname in service_ports(svc)}
        for addr in set(self.listeners) - set(wanted):
            self.listeners.pop(addr).close()
            if not any(a[0] == addr[0] for a in self.listeners):
                self.lo.remove(addr[0])
        for addr, (ns, name, pname) in wanted.items():
            if addr in self.listeners:
                continue
            try:
                self.lo.add(addr[0])
                listener = Listener(addr[0], addr[1], lambda ns=ns, name=name, p=pname: self.backends(ns, name, p))
            except (OSError, RuntimeError) as exc:
                log.warning("cannot proxy %s:%s for %s/%s: %s", *addr, ns, name, exc)
                continue
            self.listeners[addr] = listener
            listener.start()

    def close(self) -> None:
        for listener in self.listeners.values():
            listener.close()


def key(obj: dict) -> tuple[str, str]:
    return obj["metadata"].get("namespace", ""), obj["metadata"]["name"]
