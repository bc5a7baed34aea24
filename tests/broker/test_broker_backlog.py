"""capstan.v1 Admin/DescribeBroker: what a broker still holds for someone, the figures the
operator checks before it deletes a broker group."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.v1 import admin_pb2 as admin
from tests.broker.v2_requests import ack, now_ms, receive, send, stub, v2_message
from tests.waiting import wait_until


def backlog(broker) -> admin.BrokerBacklog:
    return broker.admin().DescribeBroker(admin.DescribeBrokerRequest(), timeout=10)


def test_backlog_counts_unconsumed_half_and_delayed_messages(broker):
    broker.create_topic("Orders", queues=2)
    broker.create_topic("Later", kind="DELAY", queues=1)
    broker.create_topic("Payments", kind="TRANSACTION", queues=1)
    broker.create_group("G")
    s = stub(broker.address)
    empty = backlog(broker)
    assert (empty.unconsumed, empty.half_messages, empty.timers_waiting) == (0, 0, 0)
    assert empty.master and empty.broker_name

    for i in range(3):
        assert send(s, v2_message("Orders", f"o{i}".encode())).status.code == pb.OK
    later = v2_message("Later", message_type=pb.DELAY, delivery_timestamp_ms=now_ms() + 600_000)
    assert send(s, later).status.code == pb.OK
    half = v2_message("Payments", message_type=pb.TRANSACTION)
    assert send(s, half).status.code == pb.OK
    held = backlog(broker)
    assert (held.unconsumed, held.half_messages, held.timers_waiting) == (3, 1, 1)

    # A group that reads and acknowledges everything leaves nothing unconsumed.
    got: list[pb.Message] = []
    wait_until(lambda: got.extend(receive(s, "G", "Orders")[1]) or len(got) >= 3, 15, "3 in")
    for m in got:
        ack(s, "G", "Orders", m.system_properties.receipt_handle, m.system_properties.message_id)
    wait_until(lambda: backlog(broker).unconsumed == 0, 15, "offsets committed")
