"""The webhook's delete check against a real broker: a group that holds messages is kept,
with what it holds and how to let it go; a drained one, one marked to go anyway, and one
that cannot be asked are let go."""

from __future__ import annotations

import asyncio
import base64
import functools
import subprocess
from pathlib import Path
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.webhook import (
    FORCE_DELETE_ANNOTATION,
    ServiceRef,
    ServiceWebhookServer,
    undrained_refusal,
)
from tests.broker.broker_process import BrokerProcess, free_port
from tests.broker.v2_requests import send, stub, v2_message


def group(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "orders", "namespace": "shop", "annotations": annotations or {}},
        "status": {"master": "orders-0"},
    }


def refusal(address: str, body: dict[str, Any]) -> str | None:
    async def ask() -> str | None:
        admin = BrokerGroupAdmin(address)
        try:
            return await undrained_refusal(admin, body)
        finally:
            await admin.close()

    return asyncio.run(ask())


def test_a_group_holding_messages_is_kept_unless_marked_to_go(broker: BrokerProcess) -> None:
    broker.create_topic("Orders", queues=2)
    broker.create_group("Billing")
    assert refusal(broker.address, group()) is None  # drained
    for i in range(2):
        assert (
            send(stub(broker.address), v2_message("Orders", f"o{i}".encode())).status.code == pb.OK
        )
    said = refusal(broker.address, group())
    assert said is not None
    assert said.startswith("BrokerGroup orders: the group still holds 2 unconsumed message(s)")
    assert FORCE_DELETE_ANNOTATION in said
    assert refusal(broker.address, group({FORCE_DELETE_ANNOTATION: "true"})) is None


def test_a_group_that_cannot_be_asked_or_has_no_master_is_let_go() -> None:
    assert refusal(f"127.0.0.1:{free_port()}", group()) is None
    assert asyncio.run(undrained_refusal(None, group())) is None


def test_through_a_service_each_webhook_names_it_and_the_ca_that_signed_the_server(
    tmp_path: Path,
) -> None:
    ca_key, ca, key, cert = (tmp_path / n for n in ("ca.key", "ca.crt", "tls.key", "tls.crt"))
    openssl = ("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-days", "1")
    run = functools.partial(subprocess.run, check=True, capture_output=True, timeout=60)
    run([*openssl, "-x509", "-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=test CA"])
    csr = tmp_path / "tls.csr"
    run([*openssl, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=op.capstan.svc"])
    run(
        [
            *("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
            *("-CAcreateserial", "-days", "1", "-out", str(cert)),
        ]
    )
    service = ServiceRef.parse("capstan/op")
    assert (service.port, service.host()) == (443, "op.capstan.svc")
    server = ServiceWebhookServer(
        service, addr="127.0.0.1", port=free_port(), certfile=cert, pkeyfile=key, cafile=ca
    )

    async def first_config() -> Any:
        configs = server(lambda *_, **__: None)
        try:
            return await configs.__anext__()
        finally:
            await configs.aclose()

    config = asyncio.run(first_config())
    assert config["service"] == {"namespace": "capstan", "name": "op", "port": 443}
    assert "url" not in config
    assert base64.b64decode(config["caBundle"]) == ca.read_bytes()
