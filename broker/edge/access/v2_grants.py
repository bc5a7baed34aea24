"""What each apache.rocketmq.v2 call needs, as RocketMQ 5's proxy asks it.

Sending, recalling and ending a transaction need Pub on the topic; receiving, pulling,
acknowledging, changing an invisible time, dead-lettering and offsets need Sub on the topic
and the group; a route lookup needs Pub or Sub on its topic. A heartbeat or goodbye that
names a group needs Sub on it. A Telemetry session is checked settings by settings: a
producer's topics need Pub, a consumer's group and topics Sub.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2

from capstan.broker.edge.access.rules import PUB, SUB, consume, group, topic
from capstan.security.acl import Grant

Needs = Callable[[Any], list[Grant]]


def _queue_consume(request: Any) -> list[Grant]:
    return consume(request.message_queue.topic.name, request.group.name)


def _consume(request: Any) -> list[Grant]:
    return consume(request.topic.name, request.group.name)


def _group_if_named(request: Any) -> list[Grant]:
    return [group(request.group.name, SUB)] if request.group.name else []


def _send(request: Any) -> list[Grant]:
    return [topic(name, PUB) for name in sorted({m.topic.name for m in request.messages})]


def _pub(request: Any) -> list[Grant]:
    return [topic(request.topic.name, PUB)]


def settings_needs(command: Any) -> list[Grant]:
    """What a Telemetry command's settings claim: nothing for other commands."""
    if not command.HasField("settings"):
        return []
    settings = command.settings
    if settings.HasField("publishing"):
        return [topic(t.name, PUB) for t in settings.publishing.topics]
    if settings.HasField("subscription"):
        sub = settings.subscription
        return [group(sub.group.name, SUB)] + [topic(e.topic.name, SUB) for e in sub.subscriptions]
    return []


NEEDS: dict[str, Needs] = {
    "QueryRoute": lambda r: [topic(r.topic.name, PUB, SUB)],
    "Heartbeat": _group_if_named,
    "SendMessage": _send,
    "QueryAssignment": _consume,
    "ReceiveMessage": _queue_consume,
    "AckMessage": _consume,
    "ForwardMessageToDeadLetterQueue": _consume,
    "PullMessage": _queue_consume,
    "UpdateOffset": _queue_consume,
    "GetOffset": _queue_consume,
    "QueryOffset": lambda r: [topic(r.message_queue.topic.name, SUB)],
    "EndTransaction": _pub,
    "NotifyClientTermination": _group_if_named,
    "ChangeInvisibleDuration": _consume,
    "RecallMessage": _pub,
    "SyncLiteSubscription": _consume,
}
"""Per unary or server-streaming method; Telemetry is checked by `settings_needs`."""

SERVICE = "apache.rocketmq.v2.MessagingService"
_METHODS = service_pb2.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name


def refusal(method: str, code: int, message: str) -> Any:
    """The answer of `method` that carries only a status (v2 refuses in the answer)."""
    output = _METHODS[method].output_type
    reply = _REPLY_TYPES[output.full_name]()
    reply.status.CopyFrom(pb.Status(code=code, message=message))
    return reply


_REPLY_TYPES: dict[str, Any] = {
    m.output_type.full_name: getattr(service_pb2, m.output_type.name, None)
    or getattr(pb, m.output_type.name)
    for m in _METHODS.values()
}
UNAUTHORIZED = pb.UNAUTHORIZED
FORBIDDEN = pb.FORBIDDEN
