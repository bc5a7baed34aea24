"""`capstan produce` and `capstan consume`: send and receive over the RocketMQ 5 protocol,
as any official client would."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from collections.abc import Iterator

import grpc
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.commands.admin_commands import CommandError, SubParsers, add_server
from capstan.common.message_id import new_message_id

_CLIENT_ID = f"{socket.gethostname()}@{__import__('os').getpid()}@capstan-cli"
_METADATA = (("x-mq-client-id", _CLIENT_ID), ("x-mq-language", "PYTHON"))


def add_parsers(commands: SubParsers) -> None:
    p = commands.add_parser("produce", help="send messages (the body, or one per stdin line)")
    p.add_argument("topic")
    p.add_argument("--body", help="message body; without it, each line of stdin is one message")
    p.add_argument("--count", type=int, default=1, help="send --body this many times")
    p.add_argument("--tag")
    p.add_argument("--key", action="append", default=[], help="a message key (repeatable)")
    p.add_argument("--message-group", help="FIFO message group")
    p.add_argument("--delay-s", type=float, default=None, help="deliver after this many seconds")
    p.add_argument("--property", action="append", default=[], help="NAME=VALUE (repeatable)")
    add_server(p)
    p.add_argument("--json", action="store_true", help="print one JSON line per message")
    p.set_defaults(run=_produce)

    c = commands.add_parser("consume", help="receive and acknowledge messages of a group")
    c.add_argument("topic")
    c.add_argument("--group", required=True)
    c.add_argument("--count", type=int, default=0, help="stop after this many (0: until idle)")
    c.add_argument("--tag-filter", default="*", help="tag expression: * or a||b")
    c.add_argument("--wait-s", type=float, default=5.0, help="stop after this long with nothing")
    c.add_argument("--invisible-s", type=int, default=30, help="invisible time per receive")
    c.add_argument("--no-ack", action="store_true", help="do not acknowledge (they come back)")
    add_server(c)
    c.add_argument("--json", action="store_true", help="print one JSON line per message")
    c.set_defaults(run=_consume)


def _stub(server: str) -> tuple[grpc.Channel, svc_grpc.MessagingServiceStub]:
    channel = grpc.insecure_channel(server)
    return channel, svc_grpc.MessagingServiceStub(channel)


def _check(status: pb.Status, what: str) -> None:
    if status.code not in (pb.OK, pb.MULTIPLE_RESULTS):
        raise CommandError(f"{what}: {pb.Code.Name(status.code)}: {status.message}")


def _bodies(args: argparse.Namespace) -> Iterator[bytes]:
    if args.body is not None:
        for _ in range(max(args.count, 0)):
            yield args.body.encode()
        return
    for line in sys.stdin:
        line = line.rstrip("\n")
        if line:
            yield line.encode()


def _build(args: argparse.Namespace, body: bytes) -> pb.Message:
    props: dict[str, str] = {}
    for item in args.property:
        name, sep, value = item.partition("=")
        if not sep:
            raise CommandError(f"--property {item!r}: expected NAME=VALUE")
        props[name] = value
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


def _produce(args: argparse.Namespace) -> int:
    channel, stub = _stub(args.server)
    sent = 0
    with channel:
        for body in _bodies(args):
            request = svc.SendMessageRequest(messages=[_build(args, body)])
            try:
                reply = stub.SendMessage(request, metadata=_METADATA, timeout=10)
            except grpc.RpcError as exc:
                detail = exc.code().name
                raise CommandError(f"cannot reach a broker at {args.server}: {detail}") from None
            _check(reply.status, "send failed")
            entry = reply.entries[0]
            sent += 1
            if args.json:
                print(json.dumps({"message_id": entry.message_id, "offset": entry.offset}))
            else:
                print(f"sent {entry.message_id} (queue offset {entry.offset})")
    if not args.json:
        print(f"{sent} message(s) sent to {args.topic}", file=sys.stderr)
    return 0


def _consume(args: argparse.Namespace) -> int:
    channel, stub = _stub(args.server)
    received = 0
    idle_since = time.monotonic()
    with channel:
        while args.count <= 0 or received < args.count:
            left = args.wait_s - (time.monotonic() - idle_since)
            if left <= 0:
                break
            messages = _receive_once(stub, args, min(left, 20.0))
            if messages:
                idle_since = time.monotonic()
            for m in messages:
                received += 1
                _print_message(m, args.json)
                if not args.no_ack:
                    _ack(stub, args, m)
                if args.count and received >= args.count:
                    break
    if not args.json:
        print(f"{received} message(s) received from {args.topic}", file=sys.stderr)
    return 0


def _receive_once(
    stub: svc_grpc.MessagingServiceStub, args: argparse.Namespace, wait_s: float
) -> list[pb.Message]:
    poll = Duration()
    poll.FromMilliseconds(int(wait_s * 1000))
    invisible = Duration(seconds=args.invisible_s)
    batch = 32 if args.count <= 0 else min(32, args.count)
    request = svc.ReceiveMessageRequest(
        group=pb.Resource(name=args.group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=args.topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression=args.tag_filter),
        batch_size=batch,
        invisible_duration=invisible,
        long_polling_timeout=poll,
    )
    messages = []
    try:
        for response in stub.ReceiveMessage(request, metadata=_METADATA, timeout=wait_s + 5):
            kind = response.WhichOneof("content")
            if kind == "status" and response.status.code != pb.MESSAGE_NOT_FOUND:
                _check(response.status, "receive failed")
            elif kind == "message":
                messages.append(response.message)
    except grpc.RpcError as exc:
        raise CommandError(f"cannot reach a broker at {args.server}: {exc.code().name}") from None
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
        timeout=10,
    )
    _check(reply.status, "ack failed")


def _print_message(m: pb.Message, as_json: bool) -> None:
    sp = m.system_properties
    body = m.body.decode("utf-8", errors="replace")
    if as_json:
        row = {
            "message_id": sp.message_id,
            "topic": m.topic.name,
            "queue_id": sp.queue_id,
            "queue_offset": sp.queue_offset,
            "tag": sp.tag if sp.HasField("tag") else None,
            "keys": list(sp.keys),
            "message_group": sp.message_group if sp.HasField("message_group") else None,
            "delivery_attempt": sp.delivery_attempt,
            "properties": dict(m.user_properties),
            "body": body,
        }
        print(json.dumps(row), flush=True)
    else:
        print(
            f"{sp.message_id} queue {sp.queue_id}@{sp.queue_offset} attempt "
            f"{sp.delivery_attempt}: {body}",
            flush=True,
        )
