"""A flood of hostile calls to every method the controller serves: each is refused with its
gRPC code, the controller's log stays a few lines with no traceback, and a broker's
registration and the cluster's status are still served meanwhile; with authentication on,
the calls that change the cluster are refused unread unless the cluster signed them."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from capstan.common.grpc_services import CONTROLLER_SERVICES, REFLECTION
from capstan.controller.cluster_guard import READABLE
from capstan.security.peers import CLUSTER_ACCESS_KEY
from capstan.security.signature import Credentials, signed_metadata
from capstan.v1 import controller_pb2 as pb
from tests.controller.controller_process import ControllerProcess
from tests.hostile_calls import (
    REFUSED_OVERSIZED,
    call,
    one_per_service,
    oversized,
    payloads,
    served_methods,
    wrong_answer,
)
from tests.waiting import wait_until

SEED = 25
EACH = 4
"""Random and truncated payloads per method (the controller serves about 40 methods)."""
DEFAULT_RECEIVE_LIMIT_BYTES = 4 * 1024 * 1024
"""gRPC's own limit, which the controller keeps: its requests are small."""


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    root: Path = tmp_path_factory.mktemp("controller")
    process = ControllerProcess(root, root / "state").start()
    try:
        wait_until(lambda: process.status().leader, 10, "the controller to lead")
        yield process
    finally:
        process.stop()


def test_hostile_calls_are_refused_quietly_while_good_ones_are_served(controller):
    methods = served_methods(controller.address)
    assert {m.path.split("/")[1] for m in methods} == {*CONTROLLER_SERVICES, REFLECTION}
    rng = random.Random(SEED)
    calls = [(m, p) for m in methods for p in payloads(m, rng, EACH)]
    log_before = controller.log.read_text()
    with ThreadPoolExecutor(8) as pool, grpc.insecure_channel(controller.address) as channel:
        answers = pool.map(lambda c: (c, call(channel, c[0], c[1].data, 5)), calls)
        served = _register(controller, "during")
        wrong = [wrong_answer(m, p, code) for (m, p), code in answers]
    assert [w for w in wrong if w] == []
    assert served and _register(controller, "after")
    added = controller.log.read_text()[len(log_before) :]
    assert "Traceback" not in added, added[-3000:]
    assert len(added.splitlines()) <= 2 * len(methods), added[-3000:]


def test_a_call_missing_its_names_is_refused_as_invalid_not_looked_up(controller):
    methods = [m for m in served_methods(controller.address) if m.path.startswith("/capstan.v1.")]
    with grpc.insecure_channel(controller.address) as channel:
        codes = {m.path: call(channel, m, b"", 5) for m in methods}
    assert {path for path, code in codes.items() if code is grpc.StatusCode.NOT_FOUND} == set()


def test_a_payload_over_the_size_limit_is_refused_as_resource_exhausted(controller):
    methods = one_per_service(served_methods(controller.address))
    too_big = oversized(DEFAULT_RECEIVE_LIMIT_BYTES)
    with grpc.insecure_channel(controller.address) as channel:
        codes = {name: call(channel, m, too_big.data, 30) for name, m in methods.items()}
    assert set(codes.values()) == {REFUSED_OVERSIZED}, codes


def _register(
    controller: ControllerProcess, group: str, metadata: list[tuple[str, str]] | None = None
) -> bool:
    reply = controller.stub().RegisterBroker(
        pb.RegisterBrokerRequest(group=group, address="127.0.0.1:1", identity="a"),
        metadata=metadata,
        timeout=5,
    )
    status = controller.status()
    return reply.broker_id > 0 and group in {g.group for g in status.groups}


CLUSTER_SECRET = "the-controllers-test-secret"


@pytest.fixture(scope="module")
def secured_controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProcess]:
    root: Path = tmp_path_factory.mktemp("secured-controller")
    secret = root / "cluster-secret"
    secret.write_text(CLUSTER_SECRET)
    auth = {"enabled": True, "cluster_secret_file": str(secret)}
    process = ControllerProcess(root, root / "state", auth=auth).start()
    try:
        wait_until(lambda: process.status().leader, 10, "the controller to lead")
        yield process
    finally:
        process.stop()


def test_with_authentication_an_unsigned_flood_is_refused_and_the_cluster_is_served(
    secured_controller,
):
    controller = secured_controller
    methods = served_methods(controller.address)
    guarded = {f"/capstan.v1.Controller/{m}" for m in ("RegisterBroker", "ElectMaster")}
    assert guarded <= {m.path for m in methods}
    rng = random.Random(SEED + 28)
    calls = [(m, p) for m in methods for p in payloads(m, rng, EACH)] * 3
    assert len(calls) >= 1000
    log_before = controller.log.read_text()
    cluster = signed_metadata(Credentials(CLUSTER_ACCESS_KEY, CLUSTER_SECRET))
    with ThreadPoolExecutor(8) as pool, grpc.insecure_channel(controller.address) as channel:
        answers = pool.map(lambda c: (c, call(channel, c[0], c[1].data, 5)), calls)
        served = _register(controller, "during", cluster)
        wrong = []
        for (m, p), code in answers:
            service, _, name = m.path.lstrip("/").partition("/")
            if service == "capstan.v1.Controller" and name not in READABLE:
                if code != grpc.StatusCode.UNAUTHENTICATED:  # refused before it is read
                    wrong.append(f"{m.path} answered {code.name} to {p.kind}")
            elif code != grpc.StatusCode.UNAUTHENTICATED and wrong_answer(m, p, code):
                wrong.append(wrong_answer(m, p, code))
    assert wrong == []
    assert served and _register(controller, "after", cluster)
    with pytest.raises(grpc.RpcError) as unsigned:
        _register(controller, "unsigned", [])
    assert unsigned.value.code() == grpc.StatusCode.UNAUTHENTICATED
    added = controller.log.read_text()[len(log_before) :]
    assert "Traceback" not in added and CLUSTER_SECRET not in added
    assert len(added.splitlines()) <= 2 * len(methods), added[-3000:]
