"""Certificates for the local cluster, made with the openssl CLI so no crypto library is needed.

Everything lives in one directory: a CA, serving certs (the apiserver's, Kueue's webhook server's), one client
cert per component and the service-account signing key pair. Files are created once and kept, so kubeconfigs stay
valid across restarts.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CA_DAYS = 3650
CERT_DAYS = 825

# Names a pod (or a kubeconfig) may use to reach the apiserver.
APISERVER_DNS = [
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
]
# 10.96.0.1 is the first address of --service-cluster-ip-range, the `kubernetes` Service's ClusterIP (what
# in-cluster clients dial); 10.244.0.1 is the bridge address the apiserver advertises, the Service's endpoint.
APISERVER_IPS = ["127.0.0.1", "10.96.0.1", "10.244.0.1"]


@dataclass(frozen=True)
class ClientCert:
    name: str
    common_name: str
    organization: str | None


# Identities the control plane components use; RBAC's bootstrap policy knows these user names.
CLIENTS = [
    ClientCert("admin", "kubernetes-admin", "system:masters"),
    ClientCert("controller-manager", "system:kube-controller-manager", None),
    ClientCert("scheduler", "system:kube-scheduler", None),
    ClientCert("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"),
    # What the apiserver presents to aggregated API servers; they trust it through --requestheader-client-ca-file.
    ClientCert("front-proxy-client", "front-proxy-client", None),
    # Kueue's manager (an add-on); bound to Kueue's own manager ClusterRole.
    ClientCert("kueue", "kueue-manager", None),
]


@dataclass(frozen=True)
class ServingCert:
    name: str
    common_name: str
    dns: tuple[str, ...]
    ips: tuple[str, ...]

    @property
    def sans(self) -> list[str]:
        return [f"DNS:{n}" for n in self.dns] + [f"IP:{ip}" for ip in self.ips]


SERVING = [
    ServingCert("apiserver", "kube-apiserver", tuple(APISERVER_DNS), tuple(APISERVER_IPS)),
    # Kueue's webhook server (and its metrics server): the apiserver calls it at https://127.0.0.1:<port>.
    ServingCert("kueue-webhook", "kueue-webhook", ("localhost",), ("127.0.0.1",)),
]


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(path))
    path.chmod(0o600)


def _subject(common_name: str, organization: str | None) -> str:
    return (f"/O={organization}" if organization else "") + f"/CN={common_name}"


def _sign(pki: Path, name: str, subject: str, extensions: str) -> tuple[Path, Path]:
    crt, key, csr = pki / f"{name}.crt", pki / f"{name}.key", pki / f"{name}.csr"
    _new_key(key)
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr))
    with tempfile.NamedTemporaryFile("w", suffix=".ext") as ext:
        ext.write(extensions)
        ext.flush()
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
            "-CAcreateserial", "-days", str(CERT_DAYS), "-sha256", "-extfile", ext.name, "-out", str(crt),
        )
    csr.unlink()
    return crt, key


def issue_client_cert(pki: Path, name: str, common_name: str, organization: str | None = None) -> tuple[Path, Path]:
    """Signs a client certificate with the cluster CA; returns (cert, key). Kept if it already exists."""
    crt, key = pki / f"{name}.crt", pki / f"{name}.key"
    if crt.exists() and key.exists():
        return crt, key
    extensions = (
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    )
    return _sign(pki, name, _subject(common_name, organization), extensions)


def _sans_of(crt: Path) -> set[str]:
    """The subjectAltNames of a certificate as openssl prints them, normalised to DNS:x / IP:y."""
    result = subprocess.run(["openssl", "x509", "-in", str(crt), "-noout", "-ext", "subjectAltName"],
                            capture_output=True, text=True)
    text = result.stdout.split("\n", 1)[-1] if result.returncode == 0 else ""
    return {part.strip().replace("IP Address:", "IP:") for part in text.split(",") if part.strip()}


def issue_serving_cert(pki: Path, cert: ServingCert) -> None:
    """Kept while it covers every SAN wanted; re-issued (same CA) when a name was added since it was made."""
    crt = pki / f"{cert.name}.crt"
    if crt.exists() and set(cert.sans) <= _sans_of(crt):
        return
    extensions = (
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={','.join(cert.sans)}\n"
    )
    _sign(pki, cert.name, f"/CN={cert.common_name}", extensions)


def _create_ca(pki: Path) -> None:
    if (pki / "ca.crt").exists() and (pki / "ca.key").exists():
        return
    for stale in pki.glob("*.crt"):  # signed by a CA that is gone
        stale.unlink()
    _new_key(pki / "ca.key")
    _openssl(
        "req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=localcluster-ca", "-days", str(CA_DAYS),
        "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", str(pki / "ca.crt"),
    )


def _create_service_account_keys(pki: Path) -> None:
    if (pki / "sa.key").exists() and (pki / "sa.pub").exists():
        return
    _new_key(pki / "sa.key")
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def ensure_pki(pki: Path) -> None:
    """Creates whatever is missing of the CA, serving cert, component client certs and SA keys."""
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    _create_ca(pki)
    for cert in SERVING:
        issue_serving_cert(pki, cert)
    for client in CLIENTS:
        issue_client_cert(pki, client.name, client.common_name, client.organization)
    _create_service_account_keys(pki)
