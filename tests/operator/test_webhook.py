"""The webhook's delete check against a real broker: a group that holds messages is kept,
with what it holds and how to let it go; a drained one, one marked to go anyway, and one
that cannot be asked are let go."""

from __future__ import annotations

import asyncio
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.webhook import FORCE_DELETE_ANNOTATION, undrained_refusal
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
