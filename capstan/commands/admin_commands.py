"""`capstan topic …`, `capstan group …` and `capstan message get`: the capstan.v1 Admin API
for people. Listing commands take `--json`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict

from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc

DEFAULT_SERVER = "127.0.0.1:8081"
TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
_TIMEOUT_S = 10.0
# The controller passes topic and group calls to every broker group (controller/admin_front.py).
_ON_EVERY_GROUP = ", or the controller's (port 9876) to act on every broker group"
_SEARCH_EVERY_GROUP = ", or the controller's (port 9876) to ask every broker group"

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_server(parser: argparse.ArgumentParser, also: str = "") -> None:
    """`--server`; `also` tells what the controller's address does instead of a broker's."""
    parser.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        help=f"broker HOST:PORT{also} (default {DEFAULT_SERVER})",
    )


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_parsers(commands: SubParsers) -> None:
    topic = commands.add_parser("topic", help="create, change, delete and list topics")
    topics = topic.add_subparsers(dest="topic_command", required=True)
    for name in ("create", "update"):
        p = topics.add_parser(name, help=f"{name} a topic")
        p.add_argument("name")
        p.add_argument("--type", choices=TOPIC_TYPES, default=None, type=str.upper)
        p.add_argument("--queues", type=int, default=None, help="read and write queues")
        p.add_argument("--read-queues", type=int, default=None)
        p.add_argument("--write-queues", type=int, default=None)
        p.add_argument("--perm", type=int, default=None, help="permission bits: 2 write, 4 read")
        add_server(p, _ON_EVERY_GROUP)
        _json_flag(p)
        p.set_defaults(run=_topic_create if name == "create" else _topic_update)
    p = topics.add_parser("delete", help="delete a topic")
    p.add_argument("name")
    add_server(p, _ON_EVERY_GROUP)
    p.set_defaults(run=_topic_delete)
    p = topics.add_parser("list", help="list topics")
    p.add_argument("--system", action="store_true", help="include the broker's own topics")
    add_server(p, _SEARCH_EVERY_GROUP)
    _json_flag(p)
    p.set_defaults(run=_topic_list)
    p = topics.add_parser("describe", help="a topic with its queues")
    p.add_argument("name")
    add_server(p, _SEARCH_EVERY_GROUP)
    _json_flag(p)
    p.set_defaults(run=_topic_describe)

    group = commands.add_parser("group", help="create, change, delete and inspect groups")
    groups = group.add_subparsers(dest="group_command", required=True)
    for name in ("create", "update"):
        p = groups.add_parser(name, help=f"{name} a consumer group")
        p.add_argument("name")
        p.add_argument("--fifo", action="store_true", help="deliver each message group in order")
        p.add_argument(
            "--max-attempts",
            type=int,
            default=0,
            help="deliveries before the dead-letter topic (default 17)",
        )
        add_server(p, _ON_EVERY_GROUP)
        _json_flag(p)
        p.set_defaults(run=_group_create if name == "create" else _group_update)
    p = groups.add_parser("delete", help="delete a consumer group and its offsets")
    p.add_argument("name")
    add_server(p, _ON_EVERY_GROUP)
    p.set_defaults(run=_group_delete)
    p = groups.add_parser("list", help="list consumer groups with their lag")
    add_server(p, _SEARCH_EVERY_GROUP)
    _json_flag(p)
    p.set_defaults(run=_group_list)
    p = groups.add_parser("describe", help="a group's offsets, lag and clients")
    p.add_argument("name")
    add_server(p, _SEARCH_EVERY_GROUP)
    _json_flag(p)
    p.set_defaults(run=_group_describe)
    p = groups.add_parser("reset-offset", help="move a group's offsets on one topic")
    p.add_argument("name")
    p.add_argument("--topic", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--earliest", action="store_true")
    where.add_argument("--latest", action="store_true")
    where.add_argument("--timestamp-ms", type=int, help="first message stored at/after this")
    add_server(p)
    _json_flag(p)
    p.set_defaults(run=_group_reset)

    message = commands.add_parser("message", help="look up stored messages")
    messages = message.add_subparsers(dest="message_command", required=True)
    p = messages.add_parser("get", help="a message by its id, or messages by key")
    p.add_argument("--topic", required=True)
    by = p.add_mutually_exclusive_group(required=True)
    by.add_argument("--id", dest="message_id")
    by.add_argument("--key")
    add_server(p, _SEARCH_EVERY_GROUP)
    _json_flag(p)
    p.set_defaults(run=_message_get)


# -- plumbing ---------------------------------------------------------------------------


def _call(args: argparse.Namespace, call: Callable[[pb_grpc.AdminStub], Any]) -> Any:
    """Run one Admin call; gRPC errors become a one-line message and exit code 1."""
    with grpc.insecure_channel(args.server) as channel:
        stub = pb_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                return call(stub)
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline:
                    time.sleep(0.2)  # the broker may still be starting
                    continue
                detail = exc.details() or code.name
                if code == grpc.StatusCode.UNAVAILABLE:
                    detail = f"cannot reach a broker at {args.server}: {detail}"
                raise CommandError(detail) from None


class CommandError(Exception):
    """A failed command: printed as `error: …`, exit code 1."""


def _dump(message: Any) -> dict[str, Any]:
    """A message as JSON-ready data, with 64-bit integers as numbers (protobuf's JSON
    mapping writes them as strings, which scripts then have to convert)."""
    data = MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(message.DESCRIPTOR, data)
    return data


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
}


def _int64_as_numbers(descriptor: Any, data: dict[str, Any]) -> None:
    for field in descriptor.fields:
        value = data.get(field.name)
        if value is None:
            continue
        if field.type in _INT64_TYPES:
            data[field.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if isinstance(value, list) else [value]:
                _int64_as_numbers(field.message_type, item)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=None, sort_keys=True))


def _type_name(value: int) -> str:
    return pb.TopicType.Name(value)


# -- topics -----------------------------------------------------------------------------


def _topic_message(args: argparse.Namespace) -> pb.Topic:
    read = args.read_queues if args.read_queues is not None else args.queues
    write = args.write_queues if args.write_queues is not None else args.queues
    if any(value is not None and value < 1 for value in (read, write)):
        raise CommandError("--queues must be at least 1")
    return pb.Topic(
        name=args.name,
        type=args.type or "TOPIC_TYPE_UNSPECIFIED",
        read_queue_nums=read or 0,
        write_queue_nums=write or 0,
        perm=args.perm or 0,
    )


def _print_topic(status: pb.TopicStatus, as_json: bool) -> None:
    if as_json:
        _print_json(_dump(status))
        return
    t = status.topic
    print(
        f"topic {t.name}: type {_type_name(t.type)}, {t.read_queue_nums} read / "
        f"{t.write_queue_nums} write queues, perm {t.perm}"
    )
    print(f"  {'QUEUE':>5} {'MIN':>12} {'MAX':>12}")
    for q in status.queues:
        print(f"  {q.queue_id:>5} {q.min_offset:>12} {q.max_offset:>12}")


def _topic_create(args: argparse.Namespace) -> int:
    request = _topic_message(args)
    if not request.read_queue_nums:
        request.read_queue_nums = request.write_queue_nums = 8
    reply = _call(args, lambda s: s.CreateTopic(request, timeout=_TIMEOUT_S))
    _print_topic(reply.topic, args.json)
    return 0


def _topic_update(args: argparse.Namespace) -> int:
    request = _topic_message(args)
    reply = _call(args, lambda s: s.UpdateTopic(request, timeout=_TIMEOUT_S))
    _print_topic(reply.topic, args.json)
    return 0


def _topic_delete(args: argparse.Namespace) -> int:
    _call(args, lambda s: s.DeleteTopic(pb.TopicRequest(name=args.name), timeout=_TIMEOUT_S))
    print(f"deleted topic {args.name}")
    return 0


def _topic_list(args: argparse.Namespace) -> int:
    reply = _call(
        args,
        lambda s: s.ListTopics(
            pb.ListTopicsRequest(include_system=args.system), timeout=_TIMEOUT_S
        ),
    )
    rows = [
        {
            "name": t.topic.name,
            "type": _type_name(t.topic.type),
            "read_queues": t.topic.read_queue_nums,
            "write_queues": t.topic.write_queue_nums,
            "perm": t.topic.perm,
            "messages": sum(q.max_offset - q.min_offset for q in t.queues),
        }
        for t in reply.topics
    ]
    if args.json:
        _print_json(rows)
        return 0
    print(f"{'TOPIC':40} {'TYPE':12} {'READ':>5} {'WRITE':>5} {'MESSAGES':>10}")
    for r in rows:
        print(
            f"{r['name']:40} {r['type']:12} {r['read_queues']:>5} {r['write_queues']:>5} "
            f"{r['messages']:>10}"
        )
    return 0


def _topic_describe(args: argparse.Namespace) -> int:
    reply = _call(
        args, lambda s: s.DescribeTopic(pb.TopicRequest(name=args.name), timeout=_TIMEOUT_S)
    )
    _print_topic(reply.topic, args.json)
    return 0


# -- groups -----------------------------------------------------------------------------


def _print_group(status: pb.GroupStatus, as_json: bool) -> None:
    if as_json:
        _print_json(_dump(status))
        return
    g = status.group
    kind = "FIFO" if g.fifo else "concurrent"
    print(f"group {g.name}: {kind}, max attempts {g.max_attempts}, total lag {status.total_lag}")
    if status.offsets:
        print(
            f"  {'TOPIC':30} {'QUEUE':>5} {'COMMITTED':>10} {'MAX':>10} {'LAG':>8} {'INFLIGHT':>8}"
        )
        for o in status.offsets:
            print(
                f"  {o.topic:30} {o.queue_id:>5} {o.committed_offset:>10} {o.max_offset:>10} "
                f"{o.lag:>8} {o.inflight:>8}"
            )
    for c in status.clients:
        print(f"  client {c.client_id} ({c.client_type}) seen {c.seconds_since_seen:.0f}s ago")
    for m in status.members.members:
        subs = ", ".join(f"{s.topic} {s.expression!r}" for s in m.subscriptions)
        owned = ", ".join(f"{q.topic}:{q.queue_id}" for q in m.owned) or "none"
        print(f"  member {m.client_id}: subscribes to {subs}; consumes {owned}")
    if not status.members.subscriptions_consistent:
        print(f"  WARNING: members subscribe differently: {status.members.inconsistency}")


def _group_request(args: argparse.Namespace) -> pb.Group:
    if args.max_attempts and args.max_attempts < 1:
        raise CommandError("--max-attempts must be at least 1")
    return pb.Group(name=args.name, fifo=args.fifo, max_attempts=args.max_attempts)


def _group_create(args: argparse.Namespace) -> int:
    request = _group_request(args)
    reply = _call(args, lambda s: s.CreateGroup(request, timeout=_TIMEOUT_S))
    _print_group(reply.group, args.json)
    return 0


def _group_update(args: argparse.Namespace) -> int:
    request = _group_request(args)
    reply = _call(args, lambda s: s.UpdateGroup(request, timeout=_TIMEOUT_S))
    _print_group(reply.group, args.json)
    return 0


def _group_delete(args: argparse.Namespace) -> int:
    _call(args, lambda s: s.DeleteGroup(pb.GroupRequest(name=args.name), timeout=_TIMEOUT_S))
    print(f"deleted group {args.name}")
    return 0


def _group_list(args: argparse.Namespace) -> int:
    reply = _call(args, lambda s: s.ListGroups(pb.ListGroupsRequest(), timeout=_TIMEOUT_S))
    rows = [
        {
            "name": g.group.name,
            "fifo": g.group.fifo,
            "max_attempts": g.group.max_attempts,
            "total_lag": g.total_lag,
            "clients": len(g.clients) + len(g.members.members),
        }
        for g in reply.groups
    ]
    if args.json:
        _print_json(rows)
        return 0
    print(f"{'GROUP':40} {'FIFO':5} {'ATTEMPTS':>8} {'LAG':>10} {'CLIENTS':>7}")
    for r in rows:
        fifo = "yes" if r["fifo"] else "no"
        print(
            f"{r['name']:40} {fifo:5} {r['max_attempts']:>8} {r['total_lag']:>10} {r['clients']:>7}"
        )
    return 0


def _group_describe(args: argparse.Namespace) -> int:
    reply = _call(
        args, lambda s: s.DescribeGroup(pb.GroupRequest(name=args.name), timeout=_TIMEOUT_S)
    )
    _print_group(reply.group, args.json)
    return 0


def _group_reset(args: argparse.Namespace) -> int:
    request = pb.ResetOffsetRequest(group=args.name, topic=args.topic)
    if args.earliest:
        request.earliest = True
    elif args.latest:
        request.latest = True
    else:
        request.timestamp_ms = args.timestamp_ms
    reply = _call(args, lambda s: s.ResetOffset(request, timeout=_TIMEOUT_S))
    if args.json:
        _print_json([_dump(o) for o in reply.offsets])
        return 0
    for o in reply.offsets:
        print(f"{o.topic} queue {o.queue_id}: offset {o.committed_offset} (lag {o.lag})")
    return 0


# -- messages ---------------------------------------------------------------------------


def _message_get(args: argparse.Namespace) -> int:
    request = pb.GetMessageRequest(topic=args.topic)
    if args.message_id:
        request.message_id = args.message_id
    else:
        request.key = args.key
    reply = _call(args, lambda s: s.GetMessage(request, timeout=_TIMEOUT_S))
    if args.json:
        rows = []
        for m in reply.messages:
            row = _dump(m)
            row["body"] = m.body.decode("utf-8", errors="replace")
            rows.append(row)
        _print_json(rows)
        return 0
    for m in reply.messages:
        print(
            f"{m.message_id} topic {m.topic} queue {m.queue_id} offset {m.queue_offset} "
            f"tag {m.tag or '-'} keys {' '.join(m.keys) or '-'}"
        )
        print(f"  {m.body.decode('utf-8', errors='replace')}")
    return 0


def run_guarded(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return run(args)
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
