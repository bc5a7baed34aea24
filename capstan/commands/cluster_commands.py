"""`capstan cluster status|elect-master`: broker groups as the controller sees them, and a
controlled switchover of a group's master (say, before a rolling restart)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from capstan.client.admin import BlockingControllerClient
from capstan.commands import reach
from capstan.commands.output import json_flag, print_json
from capstan.v1 import controller_pb2 as pb


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = commands.add_parser("cluster", help="broker groups, masters and replicas")
    sub = cluster.add_subparsers(dest="cluster_command", required=True)
    status = sub.add_parser("status", help="every group: master, epoch, SyncStateSet, replicas")
    _common(status)
    status.set_defaults(run=_status)
    elect = sub.add_parser("elect-master", help="switch a group's master (controlled)")
    elect.add_argument("group")
    elect.add_argument(
        "--broker-id",
        type=int,
        default=0,
        help="the replica to lead (default: let the controller pick, as on a master's death)",
    )
    _common(elect)
    elect.set_defaults(run=_elect)


def _common(parser: argparse.ArgumentParser) -> None:
    reach.add_server(parser, "the controller; a broker's address does not serve this")
    json_flag(parser)


def group_document(info: pb.ReplicaInfo) -> dict[str, Any]:
    """One group as `capstan cluster status --json` prints it."""
    master_offset = next((r.max_offset for r in info.replicas if r.broker_id == info.master_id), 0)
    return {
        "name": info.group,
        "epoch": info.master_epoch,
        "master": info.master_id or None,
        "sync_state_set": list(info.sync_state_set),
        "sync_state_set_epoch": info.sync_state_set_epoch,
        "replicas": [
            {
                "id": r.broker_id,
                "address": r.address,
                "role": "master" if r.broker_id == info.master_id else "slave",
                "pid": r.pid or None,
                "zone": r.zone or None,
                "ack_offset": r.max_offset,
                "lag_bytes": max(0, master_offset - r.max_offset) if info.master_id else None,
                "alive": r.alive,
                "in_sync_state_set": r.broker_id in info.sync_state_set,
            }
            for r in info.replicas
        ],
    }


def _call(
    args: argparse.Namespace, command: str, run: Callable[[BlockingControllerClient], Any]
) -> Any:
    """One Controller call at `--server`; failures become a CommandError (reach.py)."""
    return reach.call_controller(args, reach.controller_need(f"cluster {command}"), run)


def _status(args: argparse.Namespace) -> int:
    reply = _call(args, "status", lambda c: c.cluster_status())
    document = {
        "controller": reply.controller_id,
        "leader": reply.leader,
        "groups": [group_document(g) for g in reply.groups],
    }
    if args.json:
        print_json(document)
        return 0
    role = "leader" if reply.leader else "follower (brokers show as not alive here)"
    print(f"controller {reply.controller_id} ({role})")
    if not reply.groups:
        print("no broker group has registered")
    for group in document["groups"]:
        _print_group(group)
    return 0


def _print_group(group: dict[str, Any]) -> None:
    master = group["master"] if group["master"] is not None else "none (writes refused)"
    members = ",".join(str(i) for i in group["sync_state_set"]) or "-"
    print(f"\ngroup {group['name']}: master {master}, epoch {group['epoch']}, ", end="")
    print(f"SyncStateSet [{members}]")
    if len(group["sync_state_set"]) == 1 and len(group["replicas"]) > 1:
        print("  warning: the SyncStateSet holds the master alone: writes are kept on one copy")
    print(
        f"  {'ID':>3}  {'ROLE':<6}  {'ADDRESS':<22}  {'ALIVE':<5}  {'ACK OFFSET':>12}  "
        f"{'LAG BYTES':>10}  {'PID':>7}  ZONE"
    )
    for r in group["replicas"]:
        lag = "-" if r["lag_bytes"] is None else str(r["lag_bytes"])
        pid = "-" if r["pid"] is None else str(r["pid"])
        alive = "yes" if r["alive"] else "no"
        print(
            f"  {r['id']:>3}  {r['role']:<6}  {r['address']:<22}  {alive:<5}"
            f"  {r['ack_offset']:>12}  {lag:>10}  {pid:>7}  {r['zone'] or '-'}"
        )


def _elect(args: argparse.Namespace) -> int:
    reply = _call(args, "elect-master", lambda c: c.elect_master(args.group, args.broker_id))
    if args.json:
        document = {
            "changed": reply.changed,
            "reason": reply.reason,
            "group": group_document(reply.info),
        }
        print_json(document)
    else:
        print(("switched: " if reply.changed else "unchanged: ") + reply.reason)
    return 0 if reply.changed else 1
