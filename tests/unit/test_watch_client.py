"""The watches' own client: a connection for each watch, none taken from the API threads' pool."""

import logging

import pytest
from factory import with_kueue
from kubernetes.client import ApiClient
from kubernetes.config import kube_config

from elasticjob import k8s
from elasticjob.controller import reflector, watch
from elasticjob.controller.context import Context
from elasticjob.controller.mirror import Mirror
from elasticjob.rendezvous_client import StoreClient

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def pool_size(client: ApiClient) -> int:
    return client.rest_client.pool_manager.connection_pool_kw["maxsize"]


def client_of(source: reflector.Source) -> ApiClient:
    """The client a source's list call was bound to (rest.lister)."""
    return next(c.cell_contents for c in source.list_fn.__closure__ if isinstance(c.cell_contents, ApiClient))


@pytest.fixture(autouse=True)
def kubeconfig(tmp_path, monkeypatch):
    (tmp_path / "config").write_text(KUBECONFIG)
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(tmp_path / "config"))


def test_each_watch_has_a_connection_of_its_own_beside_the_api_threads():
    api = k8s.api_client()
    ctx = Context(kube=k8s.Kube(api), mirror=Mirror(), stores=StoreClient(b"k" * 32), settings=with_kueue(on=True),
                  logger=logging.getLogger("test"), instance="t")
    chosen = watch.own_client_sources(ctx, ["a", "b"])
    clients = {id(client_of(source)) for source in chosen}
    assert len(clients) == 1 and id(api) not in clients
    watching = client_of(chosen[0])
    assert pool_size(watching) == len(chosen) + reflector.LIST_THREADS
    assert pool_size(api) == k8s.CLIENT_CONNECTIONS


def test_the_api_client_holds_as_many_connections_as_asked():
    assert pool_size(k8s.api_client(connections=7)) == 7
