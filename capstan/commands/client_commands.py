"""`capstan produce` and `capstan consume`: send and receive over the RocketMQ 5 protocol
as an official client does: the topic's route from `--server` (the controller or a
broker), then the broker groups it names (routes.py)."""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import random
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.commands.output import CommandError, json_flag, print_json
from capstan.commands.reach import add_server
from capstan.commands.routes import (
    CALL_TIMEOUT_S,
    GroupDown,
    QueueRoute,
    Replicas,
    pick_queue,
    query_route,
    readable_brokers,
    writable_queues,
)
from capstan.common.message_id import new_message_id

_CLIENT_ID = f"{socket.gethostname()}@{os.getpid()}@capstan-cli"
_METADATA = (("x-mq-client-id", _CLIENT_ID), ("x-mq-language", "PYTHON"))
# Capstan brokers store a send in the queue named here, and name it back in the trailer.
_QUEUE_ID = "x-capstan-queue-id"
_STORED_QUEUES = "x-capstan-queue-ids"
_ROUTED = (
    "the controller or a broker, asked for the topic's route; messages then go to the "
    "broker groups the route names"
)
_POLL_ONE_GROUP_S = 20.0
_POLL_EACH_OF_SEVERAL_S = 2.0


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("produce", help="send messages (the body, or one per stdin line)")
    p.add_argument("topic")
    p.add_argument("--body", help="message body; without it, each line of stdin is one message")
    p.add_argument("--count", type=int, default=1, help="send --body this many times")
    p.add_argument("--tag")
    p.add_argument("--key", action="append", default=[], help="a message key (repeatable)")
    p.add_argument("--message-group", help="FIFO message group")
    p.add_argument("--delay-s", type=float, default=None, help="deliver after this many seconds")
    p.add_argument("--property", action="append", default=[], help="NAME=VALUE (repeatable)")
    add_server(p, _ROUTED)
    json_flag(p)
    p.set_defaults(run=_produce)

    c = commands.add_parser("consume", help="receive and acknowledge messages of a group")
    c.add_argument("topic")
    c.add_argument("--group", required=True)
    c.add_argument("--count", type=int, default=0, help="stop after this many (0: until idle)")
    c.add_argument("--tag-filter", default="*", help="tag expression: * or a||b")
    c.add_argument("--wait-s", type=float, default=5.0, help="stop after this long with nothing")
    c.add_argument("--invisible-s", type=int, default=30, help="invisible time per receive")
    c.add_argument("--no-ack", action="store_true", help="do not acknowledge (they come back)")
    add_server(c, _ROUTED)
    json_flag(c)
    c.set_defaults(run=_consume)


def _check(status: pb.Status, what: str) -> None:
    if status.code not in (pb.OK, pb.MULTIPLE_RESULTS):
        raise CommandError(f"{what}: {pb.Code.Name(status.code)}: {status.message}")


# -- produce --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    message_id: str
    broker: str
    queue_id: int
    queue_offset: int


def _bodies(args: argparse.Namespace) -> Iterator[bytes]:
    if args.body is not None:
        for _ in range(max(args.count, 0)):
            yield args.body.encode()
        return
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line:
            yield line.encode()


def _properties(args: argparse.Namespace) -> dict[str, str]:
    props: dict[str, str] = {}
    for item in args.property:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CommandError(f"--property {item!r}: expected NAME=VALUE")
        props[name] = value
    return props


def _build(args: argparse.Namespace, props: dict[str, str], body: bytes) -> pb.Message:
    sp = pb.SystemProperties(
        message_id=new_message_id(),
        body_encoding=pb.IDENTITY,
        born_host=socket.gethostname(),
        message_type=pb.NORMAL,
    )
    sp.born_timestamp.GetCurrentTime()
    if args.tag:
        sp.tag = args.tag
    sp.keys.extend(args.key)
    if args.message_group:
        sp.message_group = args.message_group
        sp.message_type = pb.FIFO
    if args.delay_s is not None:
        at = Timestamp()
        at.FromMilliseconds(int((time.time() + args.delay_s) * 1000))
        sp.delivery_timestamp.CopyFrom(at)
        sp.message_type = pb.DELAY
    return pb.Message(
        topic=pb.Resource(name=args.topic), user_properties=props, system_properties=sp, body=body
    )


class _Sender:
    """Sends one message at a time to a queue of the route: a message group's own queue,
    or the next in turn; a non-FIFO message passes over a broker group that is down."""

    def __init__(self, queues: list[QueueRoute]) -> None:
        self._queues = queues
        self._replicas = {q.broker.name: Replicas(q.broker) for q in queues}
        self._turn = random.randrange(len(queues))  # spread runs over the queues

    def close(self) -> None:
        for replicas in self._replicas.values():
            replicas.close()

    def send(self, message: pb.Message) -> Sent:
        group = message.system_properties.message_group
        while True:
            queue = pick_queue(self._queues, group, self._turn)
            self._turn += 1
            try:
                return self._send_to(queue, message)
            except GroupDown as exc:
                others = [q for q in self._queues if q.broker != queue.broker]
                if group or not others:
                    raise
                print(f"{exc}; sending to the other broker groups", file=sys.stderr)
                self._queues = others

    def _send_to(self, queue: QueueRoute, message: pb.Message) -> Sent:
        request = svc.SendMessageRequest(messages=[message])
        metadata = (*_METADATA, (_QUEUE_ID, str(queue.queue_id)))

        def run(stub: svc_grpc.MessagingServiceStub) -> Any:
            return stub.SendMessage.with_call(request, metadata=metadata, timeout=CALL_TIMEOUT_S)

        reply, call = self._replicas[queue.broker.name].call(run)
        _check(reply.status, "send failed")
        entry = reply.entries[0]
        _check(entry.status, "send failed")
        stored = dict(call.trailing_metadata() or ()).get(_STORED_QUEUES, "")
        queue_id = int(stored.split(",")[0]) if stored[:1].isdigit() else queue.queue_id
        return Sent(entry.message_id, queue.broker.name, queue_id, entry.offset)


def _produce(args: argparse.Namespace) -> int:
    props = _properties(args)
    queues = writable_queues(query_route(args.server, args.topic, "produce", _METADATA))
    if not queues:
        raise CommandError(f"topic {args.topic} has no writable queue now")
    sender = _Sender(queues)
    sent: list[Sent] = []
    try:
        for body in _bodies(args):
            done = sender.send(_build(args, props, body))
            sent.append(done)
            if not args.json:
                print(
                    f"sent {done.message_id} to queue {done.queue_id} at offset "
                    f"{done.queue_offset} ({done.broker})",
                    flush=True,
                )
    except CommandError as exc:
        _report(args, "messages", [asdict(s) for s in sent], error=str(exc))
        raise
    finally:
        sender.close()
    _report(args, "messages", [asdict(s) for s in sent])
    if not args.json:
        print(f"{len(sent)} message(s) sent to {args.topic}", file=sys.stderr)
    return 0


def _report(
    args: argparse.Namespace, key: str, rows: list[dict[str, Any]], error: str = ""
) -> None:
    """The one JSON object of --json (with what was done before an error, if any)."""
    if not args.json:
        return
    document: dict[str, Any] = {"topic": args.topic}
    if getattr(args, "group", None):
        document["group"] = args.group
    document[key] = rows
    if error:
        document["error"] = error
    print_json(document)


# -- consume --------------------------------------------------------------------------------


def _consume(args: argparse.Namespace) -> int:
    brokers = readable_brokers(query_route(args.server, args.topic, "consume", _METADATA))
    if not brokers:
        raise CommandError(f"topic {args.topic} has no readable queue now")
    groups = [Replicas(b) for b in brokers]
    received: list[dict[str, Any]] = []
    try:
        _consume_into(received, groups, args)
    except CommandError as exc:
        _report(args, "messages", received, error=str(exc))
        raise
    finally:
        for replicas in groups:
            replicas.close()
    _report(args, "messages", received)
    if not args.json:
        print(f"{len(received)} message(s) received from {args.topic}", file=sys.stderr)
    return 0


def _consume_into(
    received: list[dict[str, Any]], groups: list[Replicas], args: argparse.Namespace
) -> None:
    """Receive from each broker group in turn until --count or --wait-s idle."""
    poll_s = _POLL_ONE_GROUP_S if len(groups) == 1 else _POLL_EACH_OF_SEVERAL_S
    idle_since = time.monotonic()
    for turn in itertools.count():
        left = args.wait_s - (time.monotonic() - idle_since)
        if left <= 0 or 0 < args.count <= len(received):
            return
        replicas = groups[turn % len(groups)]
        want = args.count - len(received) if args.count > 0 else 32
        wait_s = min(left, poll_s)
        messages = replicas.call(functools.partial(_receive, args=args, wait_s=wait_s, want=want))
        if messages:
            idle_since = time.monotonic()
        for m in messages:
            received.append(_row(m, replicas.broker.name))
            if not args.json:
                _print_message(m, replicas.broker.name)
            if not args.no_ack:
                replicas.call(functools.partial(_ack, args=args, m=m))


def _receive(
    stub: svc_grpc.MessagingServiceStub, args: argparse.Namespace, wait_s: float, want: int
) -> list[pb.Message]:
    poll = Duration()
    poll.FromMilliseconds(int(wait_s * 1000))
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=args.group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=args.topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression=args.tag_filter),
        batch_size=min(32, want),
        invisible_duration=Duration(seconds=args.invisible_s),
        long_polling_timeout=poll,
    )
    messages = []
    for response in stub.ReceiveMessage(request, metadata=_METADATA, timeout=wait_s + 5):
        kind = response.WhichOneof("content")
        if kind == "status" and response.status.code != pb.MESSAGE_NOT_FOUND:
            _check(response.status, "receive failed")
        elif kind == "message":
            messages.append(response.message)
    return messages


def _ack(stub: svc_grpc.MessagingServiceStub, args: argparse.Namespace, m: pb.Message) -> None:
    entry = svc.AckMessageEntry(
        message_id=m.system_properties.message_id,
        receipt_handle=m.system_properties.receipt_handle,
    )
    reply = stub.AckMessage(
        svc.AckMessageRequest(
            group=pb.Resource(name=args.group), topic=pb.Resource(name=args.topic), entries=[entry]
        ),
        metadata=_METADATA,
        timeout=CALL_TIMEOUT_S,
    )
    _check(reply.status, "ack failed")


def _row(m: pb.Message, broker: str) -> dict[str, Any]:
    sp = m.system_properties
    return {
        "message_id": sp.message_id,
        "topic": m.topic.name,
        "broker": broker,
        "queue_id": sp.queue_id,
        "queue_offset": sp.queue_offset,
        "tag": sp.tag if sp.HasField("tag") else None,
        "keys": list(sp.keys),
        "message_group": sp.message_group if sp.HasField("message_group") else None,
        "delivery_attempt": sp.delivery_attempt,
        "properties": dict(m.user_properties),
        "body": m.body.decode("utf-8", errors="replace"),
    }


def _print_message(m: pb.Message, broker: str) -> None:
    sp = m.system_properties
    body = m.body.decode("utf-8", errors="replace")
    print(
        f"{sp.message_id} {broker} queue {sp.queue_id}@{sp.queue_offset} attempt "
        f"{sp.delivery_attempt}: {body}",
        flush=True,
    )
