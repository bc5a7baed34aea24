"""`capstan group …`: consumer groups through the capstan.v1 Admin API.

`group reset-offset` through the controller resets the group on every broker group's
master in turn: the controller itself refuses (each broker group has its own queues under
the same ids), but a reset to the earliest, the latest or a time means the same on each.
"""

from __future__ import annotations

import argparse
from typing import Any

from capstan.commands import reach
from capstan.commands.admin_commands import (
    ASK_EVERY_GROUP,
    ON_EVERY_GROUP,
    SubParsers,
    admin_call,
    command_name,
)
from capstan.commands.output import CommandError, dump, json_flag, print_json, width
from capstan.common.grpc_services import CONTROLLER
from capstan.v1 import admin_pb2 as pb


def add_parsers(commands: SubParsers) -> None:
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
        reach.add_server(p, ON_EVERY_GROUP)
        json_flag(p)
        p.set_defaults(run=_group_create if name == "create" else _group_update)
    p = groups.add_parser("delete", help="delete a consumer group and its offsets")
    p.add_argument("name")
    reach.add_server(p, ON_EVERY_GROUP)
    json_flag(p)
    p.set_defaults(run=_group_delete)
    p = groups.add_parser("list", help="list consumer groups with their lag")
    reach.add_server(p, ASK_EVERY_GROUP)
    json_flag(p)
    p.set_defaults(run=_group_list)
    p = groups.add_parser("describe", help="a group's offsets, lag and clients")
    p.add_argument("name")
    reach.add_server(p, ASK_EVERY_GROUP)
    json_flag(p)
    p.set_defaults(run=_group_describe)
    p = groups.add_parser("reset-offset", help="move a group's offsets on one topic")
    p.add_argument("name")
    p.add_argument("--topic", required=True)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--earliest", action="store_true")
    where.add_argument("--latest", action="store_true")
    where.add_argument("--timestamp-ms", type=int, help="first message stored at/after this")
    reach.add_server(
        p, "the controller, to reset on every broker group's master, or one broker's group"
    )
    json_flag(p)
    p.set_defaults(run=_group_reset)


def _print_group(status: pb.GroupStatus, as_json: bool) -> None:
    if as_json:
        print_json(dump(status))
        return
    g = status.group
    kind = "FIFO" if g.fifo else "concurrent"
    print(
        f"group {g.name} on {', '.join(status.brokers) or '?'}: {kind}, "
        f"max attempts {g.max_attempts}, total lag {status.total_lag}"
    )
    if status.offsets:
        b = width("BROKER", (o.broker for o in status.offsets))
        print(
            f"  {'BROKER':{b}} {'TOPIC':30} {'QUEUE':>5} {'COMMITTED':>10} {'MAX':>10} "
            f"{'LAG':>8} {'INFLIGHT':>8}"
        )
        for o in status.offsets:
            print(
                f"  {o.broker:{b}} {o.topic:30} {o.queue_id:>5} {o.committed_offset:>10} "
                f"{o.max_offset:>10} {o.lag:>8} {o.inflight:>8}"
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
    reply = admin_call(args, lambda a: a.create_group(request))
    _print_group(reply.group, args.json)
    return 0


def _group_update(args: argparse.Namespace) -> int:
    request = _group_request(args)
    reply = admin_call(args, lambda a: a.update_group(request))
    _print_group(reply.group, args.json)
    return 0


def _group_delete(args: argparse.Namespace) -> int:
    request = pb.GroupRequest(name=args.name)
    admin_call(args, lambda a: a.call("DeleteGroup", request))
    if args.json:
        print_json({"group": args.name, "deleted": True})
    else:
        print(f"deleted group {args.name}")
    return 0


def _group_list(args: argparse.Namespace) -> int:
    reply = admin_call(args, lambda a: a.list_groups())
    rows = [
        {
            "name": g.group.name,
            "broker": ",".join(g.brokers),
            "fifo": g.group.fifo,
            "max_attempts": g.group.max_attempts,
            "total_lag": g.total_lag,
            "clients": len(g.clients) + len(g.members.members),
        }
        for g in reply.groups
    ]
    if args.json:
        print_json({"groups": rows})
        return 0
    b = width("BROKER", (r["broker"] for r in rows))
    print(f"{'GROUP':40} {'BROKER':{b}} {'FIFO':5} {'ATTEMPTS':>8} {'LAG':>10} {'CLIENTS':>7}")
    for r in rows:
        fifo = "yes" if r["fifo"] else "no"
        print(
            f"{r['name']:40} {r['broker']:{b}} {fifo:5} {r['max_attempts']:>8} "
            f"{r['total_lag']:>10} {r['clients']:>7}"
        )
    return 0


def _group_describe(args: argparse.Namespace) -> int:
    request = pb.GroupRequest(name=args.name)
    reply = admin_call(args, lambda a: a.call("DescribeGroup", request))
    _print_group(reply.group, args.json)
    return 0


# -- reset-offset -------------------------------------------------------------------------


def _group_reset(args: argparse.Namespace) -> int:
    request = pb.ResetOffsetRequest(group=args.name, topic=args.topic)
    if args.earliest:
        request.earliest = True
    elif args.latest:
        request.latest = True
    else:
        request.timestamp_ms = args.timestamp_ms
    rows: list[dict[str, Any]] = []
    for broker, address in _reset_targets(args):
        reply = reach.call_admin(
            args,
            reach.admin_need(command_name(args)),
            lambda a: a.reset_offset(request),
            server=address,
        )
        # The broker names its group itself; `broker` is the fallback for one that does not.
        rows.extend({**dump(o), "broker": o.broker or broker} for o in reply.offsets)
    if args.json:
        print_json({"group": args.name, "topic": args.topic, "offsets": rows})
        return 0
    for r in rows:
        where = f"{r['broker']}: " if r["broker"] else ""
        print(
            f"{where}{r['topic']} queue {r['queue_id']}: offset {r['committed_offset']} "
            f"(lag {r['lag']})"
        )
    return 0


def _reset_targets(args: argparse.Namespace) -> list[tuple[str | None, str]]:
    """(broker group, address) to reset on: every group's master when `--server` is the
    controller; `--server` itself (group unknown) otherwise."""
    services = reach.services_at(args.server)
    if services is None or CONTROLLER not in services:
        return [(None, args.server)]
    status = reach.call_controller(
        args, reach.controller_need(command_name(args)), lambda c: c.cluster_status()
    )
    targets: list[tuple[str | None, str]] = []
    for group in status.groups:
        master = next((r.address for r in group.replicas if r.broker_id == group.master_id), "")
        if not group.master_id or not master:
            raise CommandError(f"broker group {group.group} has no master now; nothing was reset")
        targets.append((group.group, master))
    if not targets:
        raise CommandError("no broker group has registered with the controller")
    return targets
