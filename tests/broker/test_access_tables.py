"""Every method the broker serves says what it needs: a new RPC cannot slip past the
access guard by being forgotten in the grant tables."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.edge.access import v1_grants, v2_grants
from capstan.security.acl import Action, ResourceType, User, decide, grant
from capstan.v1 import admin_pb2, consumer_pb2, pull_pb2


def test_every_v2_method_has_a_row_and_telemetry_is_checked_by_its_settings():
    methods = set(svc.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name)
    assert methods - set(v2_grants.NEEDS) == {"Telemetry"}


def test_every_v1_method_of_the_client_services_has_a_row_or_is_for_super_users():
    served = {
        f"{service.full_name}/{method.name}"
        for module in (admin_pb2, consumer_pb2, pull_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    streamed = {"capstan.v1.Admin/CompactTopic"}  # checked chunk by chunk
    assert served - set(v1_grants.NEEDS) - streamed == set(v1_grants.SUPER_ONLY)


def test_telemetry_settings_claim_what_the_client_will_do():
    producer = svc.TelemetryCommand(
        settings=pb.Settings(
            publishing=pb.Publishing(topics=[pb.Resource(name="a"), pb.Resource(name="b")])
        )
    )
    assert [str(g) for g in v2_grants.settings_needs(producer)] == [
        "Pub on Topic:a",
        "Pub on Topic:b",
    ]
    consumer = svc.TelemetryCommand(
        settings=pb.Settings(
            subscription=pb.Subscription(
                group=pb.Resource(name="g"),
                subscriptions=[pb.SubscriptionEntry(topic=pb.Resource(name="%RETRY%g"))],
            )
        )
    )
    # A group's retry topic is the group's.
    assert [str(g) for g in v2_grants.settings_needs(consumer)] == ["Sub on Group:g"] * 2
    assert v2_grants.settings_needs(svc.TelemetryCommand()) == []


def test_a_receive_needs_sub_on_both_the_topic_and_the_group():
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name="billing"),
        message_queue=pb.MessageQueue(topic=pb.Resource(name="orders")),
    )
    needs = v2_grants.NEEDS["ReceiveMessage"](request)
    topic_only = User("u1", "secret-1", policy=())
    assert not decide(topic_only, needs, None).allowed
    assert needs == [
        grant(ResourceType.TOPIC, "orders", Action.SUB),
        grant(ResourceType.GROUP, "billing", Action.SUB),
    ]
