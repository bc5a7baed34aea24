"""`capstan topic …` and `capstan message get`: the capstan.v1 Admin API for people (the
groups are in group_commands.py). Through the controller, the default `--server`, a change
reaches every broker group and a read asks them all; through one broker, its group only."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeAlias

from capstan.client.admin import BlockingAdminClient
from capstan.commands import reach, static_topic_commands
from capstan.commands.output import CommandError, dump, json_flag, print_json, width
from capstan.v1 import admin_pb2 as pb

TOPIC_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")
ON_EVERY_GROUP = (
    "the controller, to act on every broker group, or one broker, to act on its group alone"
)
ASK_EVERY_GROUP = "the controller, to ask every broker group, or one broker, to ask its group"

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def add_topic_parsers(commands: SubParsers) -> None:
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
        p.add_argument(
            "--attribute",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a topic attribute, e.g. cleanup.policy=COMPACT (repeatable; on update, "
            "the attributes given replace all of them)",
        )
        if name == "create":
            static_topic_commands.add_create_flags(p)
        reach.add_server(p, ON_EVERY_GROUP)
        json_flag(p)
        p.set_defaults(run=_topic_create if name == "create" else _topic_update)
    p = topics.add_parser(
        "remap",
        help="move a static topic's logic queue to another broker group",
        description="Moves the writes of one logic queue of a static topic to GROUP: the "
        "queue is sealed on its group, then opened on GROUP at the next logic offset; older "
        "offsets stay readable where they are.",
    )
    p.add_argument("name")
    p.add_argument("queue", type=int, help="the logic queue id")
    p.add_argument("group", help="the broker group to move its writes to")
    reach.add_server(p, "the controller, which decides static topics' mappings")
    json_flag(p)
    p.set_defaults(run=_topic_remap)
    p = topics.add_parser("delete", help="delete a topic")
    p.add_argument("name")
    reach.add_server(p, ON_EVERY_GROUP)
    json_flag(p)
    p.set_defaults(run=_topic_delete)
    p = topics.add_parser("list", help="list topics")
    p.add_argument("--system", action="store_true", help="include the broker's own topics")
    reach.add_server(p, ASK_EVERY_GROUP)
    json_flag(p)
    p.set_defaults(run=_topic_list)
    p = topics.add_parser("describe", help="a topic with its queues")
    p.add_argument("name")
    reach.add_server(p, ASK_EVERY_GROUP)
    json_flag(p)
    p.set_defaults(run=_topic_describe)


def add_message_parsers(commands: SubParsers) -> None:
    message = commands.add_parser("message", help="look up stored messages")
    messages = message.add_subparsers(dest="message_command", required=True)
    p = messages.add_parser("get", help="a message by its id, or messages by key")
    p.add_argument("--topic", required=True)
    by = p.add_mutually_exclusive_group(required=True)
    by.add_argument("--id", dest="message_id")
    by.add_argument("--key")
    reach.add_server(p, ASK_EVERY_GROUP)
    json_flag(p)
    p.set_defaults(run=_message_get)


def command_name(args: argparse.Namespace) -> str:
    """The command as typed, `topic list` say, for messages that name it."""
    return f"{args.command} {getattr(args, f'{args.command}_command', '')}".strip()


def admin_call(args: argparse.Namespace, call: Callable[[BlockingAdminClient], Any]) -> Any:
    """One Admin call at `--server`; failures become a CommandError (reach.py)."""
    return reach.call_admin(args, reach.admin_need(command_name(args)), call)


# -- topics -----------------------------------------------------------------------------


def _type_name(value: int) -> str:
    return pb.TopicType.Name(value)


def _topic_message(args: argparse.Namespace) -> pb.Topic:
    read = args.read_queues if args.read_queues is not None else args.queues
    write = args.write_queues if args.write_queues is not None else args.queues
    if any(value is not None and value < 1 for value in (read, write)):
        raise CommandError("--queues must be at least 1")
    attributes = {}
    for pair in args.attribute:
        key, equals, value = pair.partition("=")
        if not key or not equals:
            raise CommandError(f"--attribute {pair!r}: give KEY=VALUE")
        attributes[key] = value
    return pb.Topic(
        name=args.name,
        type=args.type or "TOPIC_TYPE_UNSPECIFIED",
        read_queue_nums=read or 0,
        write_queue_nums=write or 0,
        perm=args.perm or 0,
        attributes=attributes,
    )


def _print_topic(status: pb.TopicStatus, as_json: bool) -> None:
    if as_json:
        print_json(dump(status))
        return
    t = status.topic
    print(
        f"topic {t.name} on {', '.join(status.brokers) or '?'}: type {_type_name(t.type)}, "
        f"{t.read_queue_nums} read / {t.write_queue_nums} write queues, perm {t.perm}"
    )
    if t.attributes:
        print("  attributes: " + ", ".join(f"{k}={v}" for k, v in sorted(t.attributes.items())))
    b = width("BROKER", (q.broker for q in status.queues))
    print(f"  {'BROKER':{b}} {'QUEUE':>5} {'MIN':>12} {'MAX':>12}")
    for q in status.queues:
        print(f"  {q.broker:{b}} {q.queue_id:>5} {q.min_offset:>12} {q.max_offset:>12}")


def _topic_create(args: argparse.Namespace) -> int:
    request = _topic_message(args)
    if not request.read_queue_nums:
        request.read_queue_nums = request.write_queue_nums = 8
    if args.groups and not args.static:
        raise CommandError("--groups is for a static topic: add --static")
    if args.static:
        groups = static_topic_commands.static_groups(args.groups)
        made = admin_call(args, lambda a: a.create_static_topic(request, groups))
        _print_static(made.topic, made.mapping, args.json)
        return 0
    reply = admin_call(args, lambda a: a.create_topic(request))
    _print_topic(reply.topic, args.json)
    return 0


def _print_static(status: pb.TopicStatus, mapping: pb.QueueMapping, as_json: bool) -> None:
    if as_json:
        print_json({**dump(status), "queue_mapping": dump(mapping)})
        return
    _print_topic(status, False)
    static_topic_commands.print_mapping(mapping)


def _topic_remap(args: argparse.Namespace) -> int:
    reply = admin_call(args, lambda a: a.remap_static_queue(args.name, args.queue, args.group))
    if args.json:
        print_json({"queue_mapping": dump(reply.mapping)})
    else:
        print(f"logic queue {args.queue} of {args.name} takes its writes on {args.group} now")
        static_topic_commands.print_mapping(reply.mapping)
    return 0


def _topic_update(args: argparse.Namespace) -> int:
    request = _topic_message(args)
    reply = admin_call(args, lambda a: a.update_topic(request))
    _print_topic(reply.topic, args.json)
    return 0


def _topic_delete(args: argparse.Namespace) -> int:
    request = pb.TopicRequest(name=args.name)
    admin_call(args, lambda a: a.call("DeleteTopic", request))
    if args.json:
        print_json({"topic": args.name, "deleted": True})
    else:
        print(f"deleted topic {args.name}")
    return 0


def _topic_list(args: argparse.Namespace) -> int:
    request = pb.ListTopicsRequest(include_system=args.system)
    reply = admin_call(args, lambda a: a.list_topics(request))
    rows = [
        {
            "name": t.topic.name,
            "broker": ",".join(t.brokers),
            "type": _type_name(t.topic.type),
            "read_queues": t.topic.read_queue_nums,
            "write_queues": t.topic.write_queue_nums,
            "perm": t.topic.perm,
            "messages": sum(q.max_offset - q.min_offset for q in t.queues),
        }
        for t in reply.topics
    ]
    if args.json:
        print_json({"topics": rows})
        return 0
    b = width("BROKER", (r["broker"] for r in rows))
    print(f"{'TOPIC':40} {'BROKER':{b}} {'TYPE':12} {'READ':>5} {'WRITE':>5} {'MESSAGES':>10}")
    for r in rows:
        print(
            f"{r['name']:40} {r['broker']:{b}} {r['type']:12} {r['read_queues']:>5} "
            f"{r['write_queues']:>5} {r['messages']:>10}"
        )
    return 0


def _topic_describe(args: argparse.Namespace) -> int:
    request = pb.TopicRequest(name=args.name)
    reply = admin_call(args, lambda a: a.call("DescribeTopic", request))
    static = admin_call(args, lambda a: static_topic_commands.mapping_or_none(a, args.name))
    if static is None:
        _print_topic(reply.topic, args.json)
    else:
        _print_static(reply.topic, static.mapping, args.json)
    return 0


# -- messages ---------------------------------------------------------------------------


def _message_get(args: argparse.Namespace) -> int:
    request = pb.GetMessageRequest(topic=args.topic)
    if args.message_id:
        request.message_id = args.message_id
    else:
        request.key = args.key
    reply = admin_call(args, lambda a: a.get_message(request))
    if args.json:
        rows = []
        for m in reply.messages:
            row = dump(m)
            row["body"] = m.body.decode("utf-8", errors="replace")
            rows.append(row)
        print_json({"messages": rows})
        return 0
    for m in reply.messages:
        print(
            f"{m.message_id} {m.broker} topic {m.topic} queue {m.queue_id} offset {m.queue_offset} "
            f"tag {m.tag or '-'} keys {' '.join(m.keys) or '-'}"
        )
        print(f"  {m.body.decode('utf-8', errors='replace')}")
    return 0
