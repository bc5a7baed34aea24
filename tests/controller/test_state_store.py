"""The contract every controller state store keeps: compare-and-swap writes,
one leader at a time with expiry and resignation, corruption reported rather than guessed
over. Every backend runs every test that takes the `backend` fixture: the file store, and
the Kubernetes store against the API server emulator of tests/kube. The other tests are
about one backend's own records: its files, or its ConfigMap and Lease."""

from __future__ import annotations

import json
import multiprocessing
import pathlib
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kmock
import pytest
import urllib3
from kubernetes import client

from capstan.controller.kubernetes_state_store import (
    STATE_KEY,
    KubernetesStateStore,
    StateUnavailable,
)
from capstan.controller.server import open_state_store
from capstan.controller.settings import ControllerSettings, StateSettings
from capstan.controller.state_store import (
    LEASE_FILE,
    STATE_FILE,
    FileStateStore,
    StateConflict,
    StateCorrupt,
    StateStore,
    Versioned,
)
from capstan.kube.rest import KubeRest
from tests.kube.api_server import RunningApiServer, serve_in_thread
from tests.kube.control_plane import TOKEN, ControlPlane

NAMESPACE = "capstan"
NAME = "controller-state"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Factory = Callable[[], StateStore]
"""A new client of one shared store (as a second controller replica would be)."""


@pytest.fixture(params=["file", "kubernetes-emulator", "kubernetes"])
def backend(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> Iterator[tuple[Factory, FakeClock]]:
    clock = FakeClock()
    if request.param == "file":
        yield (lambda: FileStateStore(tmp_path / "controller", clock=clock)), clock
        return
    if request.param == "kubernetes":  # a real API server (tests/kube/control_plane.py)
        plane = request.getfixturevalue("control_plane")
        assert isinstance(plane, ControlPlane)
        api = plane.api()
        namespace = f"state-{uuid.uuid4().hex[:8]}"
        client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        yield (lambda: KubernetesStateStore(api, namespace, NAME, clock)), clock
        return
    with serve_in_thread() as server:
        yield (lambda: KubernetesStateStore(server.api_client(), NAMESPACE, NAME, clock)), clock


def test_a_new_store_is_empty_and_a_write_is_read_back_by_every_client(backend):
    open_store, _ = backend
    a, b = open_store(), open_store()
    assert a.read().document == {} and a.read().version == ""
    v1 = a.write({"groups": {"g": {"master": 1}}}, "")
    assert b.read().document == {"groups": {"g": {"master": 1}}}
    assert b.read().version == v1
    v2 = b.write({"groups": {"g": {"master": 2}}}, v1)
    assert v2 != v1
    assert a.read().document["groups"]["g"]["master"] == 2


def test_a_write_from_a_stale_read_conflicts_and_changes_nothing(backend):
    open_store, _ = backend
    a, b = open_store(), open_store()
    base = a.write({"n": 0}, "")
    b.write({"n": 1}, base)
    with pytest.raises(StateConflict, match="version"):
        a.write({"n": 99}, base)
    with pytest.raises(StateConflict):
        a.write({"n": 99}, "")  # "never written" is stale too
    assert a.read().document == {"n": 1}
    assert StateConflict.retriable


def _increment(store: StateStore, times: int) -> None:
    for _ in range(times):
        while True:
            current = store.read()
            try:
                store.write({"n": current.document.get("n", 0) + 1}, current.version)
                break
            except StateConflict:
                continue


def _increment_in(directory: str, times: int) -> None:
    _increment(FileStateStore(pathlib.Path(directory)), times)


def test_concurrent_writers_lose_no_update(backend):
    """Read, add one, write if unchanged: four clients at once, and every update counts."""
    open_store, _ = backend
    stores = [open_store() for _ in range(4)]
    with ThreadPoolExecutor(len(stores)) as pool:
        for done in [pool.submit(_increment, store, 25) for store in stores]:
            done.result(timeout=30)
    assert open_store().read().document == {"n": 100}


def test_concurrent_writers_in_separate_processes_lose_no_update(tmp_path):
    """Optimistic concurrency holds across processes: read, add one, write if unchanged."""
    directory = tmp_path / "shared"
    FileStateStore(directory)
    workers = [
        multiprocessing.get_context("spawn").Process(
            target=_increment_in, args=(str(directory), 25)
        )
        for _ in range(4)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    assert FileStateStore(directory).read().document == {"n": 100}


def test_one_leader_at_a_time_until_it_lapses_or_resigns(backend):
    open_store, clock = backend
    a, b = open_store(), open_store()
    assert a.leader() is None
    assert a.try_lead("controller-a", 10)
    assert not b.try_lead("controller-b", 10)
    lease = b.leader()
    assert lease is not None and lease.holder == "controller-a"
    clock.now += 8
    assert a.try_lead("controller-a", 10)  # renewed: good for 10 s from now
    clock.now += 8
    assert not b.try_lead("controller-b", 10)
    clock.now += 3  # 11 s after the renewal
    assert a.leader() is None
    assert b.try_lead("controller-b", 10)
    assert not a.try_lead("controller-a", 10)
    a.resign("controller-a")  # not the holder: nothing happens
    assert b.leader().holder == "controller-b"  # type: ignore[union-attr]
    b.resign("controller-b")
    assert a.leader() is None
    assert a.try_lead("controller-a", 10)


def _lead_together(stores: list[StateStore]) -> list[bool]:
    """Every store's candidate asks for the lease at the same moment; who got it."""
    start = threading.Barrier(len(stores))

    def attempt(i: int) -> bool:
        start.wait(timeout=10)
        return stores[i].try_lead(f"controller-{i}", 10)

    with ThreadPoolExecutor(len(stores)) as pool:
        return list(pool.map(attempt, range(len(stores))))


def test_of_candidates_racing_for_a_free_or_a_lapsed_lease_exactly_one_leads(backend):
    open_store, clock = backend
    stores = [open_store() for _ in range(5)]
    for _ in ("free", "lapsed"):
        won = _lead_together(stores)
        assert won.count(True) == 1
        assert stores[0].leader().holder == f"controller-{won.index(True)}"  # type: ignore[union-attr]
        clock.now += 11


def test_a_lease_needs_a_holder_and_a_duration(backend):
    open_store, _ = backend
    store = open_store()
    with pytest.raises(ValueError):
        store.try_lead("", 10)
    with pytest.raises(ValueError):
        store.try_lead("x", 0)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        (STATE_FILE, b'{"version": 3, "docu'),
        (STATE_FILE, b"[1, 2]"),
        (STATE_FILE, b'{"version": "3", "document": {}}'),
        (STATE_FILE, b"\xff\xfe"),
        (LEASE_FILE, b'{"holder": "a", "renewed_at_s": "soon"}'),
    ],
    ids=["torn", "not-an-object", "bad-version", "not-utf8", "bad-lease"],
)
def test_a_damaged_file_is_reported_not_guessed_over(tmp_path, name, content):
    store = FileStateStore(tmp_path)
    store.write({"n": 1}, "")
    (tmp_path / name).write_bytes(content)
    with pytest.raises(StateCorrupt, match=name):
        store.read() if name == STATE_FILE else store.leader()
    if name == STATE_FILE:
        with pytest.raises(StateCorrupt):
            store.write({"n": 2}, "1")


@pytest.fixture
def api_server() -> Iterator[RunningApiServer]:
    with serve_in_thread() as server:
        yield server


def _config_maps(server: RunningApiServer) -> client.CoreV1Api:
    return client.CoreV1Api(server.api_client())


def _raw(server: RunningApiServer, path: str) -> Any:
    """An object as the API server holds it, as kubectl would print it."""
    with urllib3.PoolManager() as http:
        return json.loads(http.request("GET", server.url + path).data)


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        ({STATE_KEY: '{"n": 1, "gro'}, "not valid JSON"),
        ({STATE_KEY: "[1, 2]"}, "holds list, not an object"),
        ({"other.json": "{}"}, "no data key state.json"),
    ],
    ids=["torn", "not-an-object", "no-state-key"],
)
def test_a_damaged_config_map_is_reported_not_guessed_over(api_server, data, complaint):
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=NAME), data=data)
    _config_maps(api_server).create_namespaced_config_map(NAMESPACE, body)
    with pytest.raises(StateCorrupt, match=f"{NAMESPACE}/{NAME}.*{complaint}"):
        KubernetesStateStore(api_server.api_client(), NAMESPACE, NAME).read()


def test_a_lease_held_without_a_renewal_time_is_reported(api_server):
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name=f"{NAME}-leader"),
        spec=client.V1LeaseSpec(holder_identity="someone", lease_duration_seconds=10),
    )
    client.CoordinationV1Api(api_server.api_client()).create_namespaced_lease(NAMESPACE, lease)
    store = KubernetesStateStore(api_server.api_client(), NAMESPACE, NAME)
    with pytest.raises(StateCorrupt, match="held by someone but lacks renewTime"):
        store.leader()
    with pytest.raises(StateCorrupt):
        store.try_lead("me", 10)


def test_the_state_is_json_in_a_config_map_at_its_resource_version(api_server):
    store = KubernetesStateStore(api_server.api_client(), NAMESPACE, NAME)
    version = store.write({"groups": {"g": {"master": 1}}}, "")
    stored = _raw(api_server, f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}")
    assert json.loads(stored["data"][STATE_KEY]) == {"groups": {"g": {"master": 1}}}
    assert stored["metadata"]["resourceVersion"] == version


def test_the_leader_holds_a_coordination_lease_as_client_go_writes_it(api_server):
    clock = FakeClock()
    store = KubernetesStateStore(api_server.api_client(), NAMESPACE, NAME, clock)
    path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{NAME}-leader"
    assert store.try_lead("controller-a", 2.5)
    taken = _raw(api_server, path)["spec"]
    assert taken["holderIdentity"] == "controller-a"
    assert taken["leaseDurationSeconds"] == 3  # whole seconds, rounded up
    assert taken["renewTime"] == taken["acquireTime"] == "1970-01-12T13:46:40.000000+00:00"
    assert taken["leaseTransitions"] == 0
    clock.now += 2
    assert store.try_lead("controller-a", 2.5)
    renewed = _raw(api_server, path)["spec"]
    assert renewed["acquireTime"] == taken["acquireTime"] != renewed["renewTime"]
    assert renewed["leaseTransitions"] == 0
    clock.now += 4
    assert store.try_lead("controller-b", 10)
    assert _raw(api_server, path)["spec"]["leaseTransitions"] == 1
    store.resign("controller-b")
    assert "holderIdentity" not in _raw(api_server, path)["spec"]


def test_api_failures_are_retriable_and_name_the_object(api_server):
    assert api_server.emulator is not None
    api_server.emulator[kmock.resource("v1/configmaps")] << 500
    store = KubernetesStateStore(api_server.api_client(), NAMESPACE, NAME)
    with pytest.raises(StateUnavailable, match=f"reading configmap {NAMESPACE}/{NAME}.* 500"):
        store.read()
    assert StateUnavailable.retriable


def test_an_unreachable_api_server_is_unavailable():
    with serve_in_thread() as server:
        store = KubernetesStateStore(server.api_client(), NAMESPACE, NAME, request_timeout_s=1)
    with pytest.raises(StateUnavailable, match=f"lease {NAMESPACE}/{NAME}-leader.*no answer"):
        store.try_lead("controller-a", 10)


def test_the_kubernetes_backend_is_opened_from_the_kubeconfig_outside_a_cluster(
    control_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controller run outside a pod (no service account) reaches the API server that
    KUBECONFIG names, and keeps its state there."""
    namespace = f"state-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(control_plane.api()).create_namespace({"metadata": {"name": namespace}})
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = ControllerSettings(
        state=StateSettings(backend="kubernetes", namespace=namespace, name="opened")
    )
    store = open_state_store(settings)
    version = store.write({"groups": {}}, "")
    assert store.read().version == version
    stored = client.CoreV1Api(control_plane.api()).read_namespaced_config_map("opened", namespace)
    assert stored.metadata.name == "opened"


def _service_account(plane: ControlPlane, directory: pathlib.Path, token: str) -> pathlib.Path:
    """What the kubelet mounts in a pod: its token and the cluster's CA."""
    directory.mkdir()
    (directory / "token").write_text(token + "\n")
    (directory / "ca.crt").write_bytes((plane.root / "certs" / "apiserver.crt").read_bytes())
    return directory


def test_the_kubernetes_backend_in_a_pod_uses_its_service_account(
    control_plane: ControlPlane, tmp_path: pathlib.Path
) -> None:
    """In a pod the store reaches the API server at KUBERNETES_SERVICE_HOST:PORT, trusting
    the mounted CA and sending the mounted token; a token the server does not know is a
    retriable failure that says the server refused it."""
    namespace = f"state-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(control_plane.api()).create_namespace({"metadata": {"name": namespace}})
    pod_env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(control_plane.port),
    }
    rest = KubeRest.in_cluster(pod_env, _service_account(control_plane, tmp_path / "sa", TOKEN))
    assert rest is not None
    store = KubernetesStateStore(rest, namespace, NAME)
    version = store.write({"groups": {"g": {"master": 2}}}, "")
    assert store.read() == Versioned({"groups": {"g": {"master": 2}}}, version)
    assert store.try_lead("controller-a", 10)
    assert store.leader() is not None and store.leader().holder == "controller-a"

    stranger = KubeRest.in_cluster(pod_env, _service_account(control_plane, tmp_path / "x", "nope"))
    assert stranger is not None
    with pytest.raises(StateUnavailable, match=f"reading configmap {namespace}/{NAME}.* 401"):
        KubernetesStateStore(stranger, namespace, NAME).read()
