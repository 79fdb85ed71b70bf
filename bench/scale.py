"""How the operator scales with a job's size, against the local cluster's real API server.

For jobs of N workers (containers run `sleep`, so the nodes' CPUs are not the bottleneck) it measures the
time from `create` to N worker pods existing (the operator's concurrent creates) and to N Running (the whole
cluster), and the reconciles the operator ran (its Prometheus counter), all in one run and printed as a
table with the per-pod cost relative to the smallest job.

    make cluster-up && .venv/bin/python bench/scale.py [--sizes 10 50 100]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from kubernetes import client, config

ROOT = Path(__file__).resolve().parents[1]
KUBECONFIG = ROOT / ".localcluster" / "kubeconfig"
NAMESPACE = "elasticjob-bench"
METRICS_PORT = 9309
GROUP, VERSION, PLURAL = "elasticjob.dev", "v1alpha1", "elasticjobs"


def manifest(name: str, replicas: int) -> dict:
    container = {"name": "worker", "image": "bench", "command": ["sleep", "3600"],
                 "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ElasticJob", "metadata": {"name": name},
            "spec": {"minReplicas": 1, "maxReplicas": replicas, "replicas": replicas,
                     "template": {"spec": {"terminationGracePeriodSeconds": 1, "containers": [container]}}}}


def reconciles() -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()
    return sum(float(m) for m in re.findall(r'^elasticjob_reconciles_total\{result="ok"\} (\S+)', text, re.M))


def wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


def measure(custom, core, size: int) -> tuple[float, float, float]:
    name = f"bench-{size}-{int(time.time() * 1000) % 100000}"
    selector = f"elasticjob.dev/job-name={name},elasticjob.dev/role=worker"
    before = reconciles()
    start = time.monotonic()
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, manifest(name, size))
    wait(lambda: len(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items) == size, 300,
         f"{size} pods created")
    created = time.monotonic() - start
    wait(lambda: sum(p.status.phase == "Running" for p in
                     core.list_namespaced_pod(NAMESPACE, label_selector=selector).items) == size, 600,
         f"{size} pods running")
    running = time.monotonic() - start
    work = reconciles() - before
    custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    wait(lambda: not core.list_namespaced_pod(NAMESPACE, label_selector=f"elasticjob.dev/job-name={name}").items,
         300, f"{name}'s pods gone")
    return created, running, work


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 30, 90])
    args = parser.parse_args()
    api = config.new_client_from_config(config_file=str(KUBECONFIG))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), "apply", "--server-side", "-f",
                    str(ROOT / "crds" / "elasticjob.dev_elasticjobs.yaml")], check=True, capture_output=True)
    subprocess.run(["kubectl", "--kubeconfig", str(KUBECONFIG), "create", "namespace", NAMESPACE],
                   capture_output=True)
    operator = subprocess.Popen([sys.executable, "-m", "elasticjob", "run", "-n", NAMESPACE, "--metrics-port",
                                 str(METRICS_PORT)], env={**os.environ, "KUBECONFIG": str(KUBECONFIG)},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait(lambda: _metrics_up(), 60, "the operator's metrics endpoint")
        measure(custom, core, args.sizes[0])  # warm-up: the operator's first watch and client connections
        rows = [(size, *measure(custom, core, size)) for size in args.sizes]
    finally:
        operator.send_signal(signal.SIGTERM)
        operator.wait(timeout=30)
    base = rows[0][1] / rows[0][0]
    print(f"{'workers':>7} | {'all created s':>13} | {'all running s':>13} | {'reconciles':>10} | "
          f"{'ms/pod created':>14} | {'vs smallest':>11}")
    print("-" * 84)
    for size, created, running, work in rows:
        per_pod = created / size
        print(f"{size:>7} | {created:>13.2f} | {running:>13.2f} | {work:>10.0f} | {per_pod * 1e3:>14.1f} | "
              f"{per_pod / base:>10.2f}x")
    return 0


def _metrics_up() -> bool:
    try:
        reconciles()
        return True
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
