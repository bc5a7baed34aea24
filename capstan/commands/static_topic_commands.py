"""`capstan topic create --static`, `capstan topic remap` and the queue mapping `capstan
topic describe` shows for a static topic (docs/static_topics.md): logic queues mapped onto
broker groups, which the controller decides and keeps."""

from __future__ import annotations

import argparse

from capstan.client.admin import BlockingAdminClient
from capstan.client.errors import ClientError
from capstan.commands.output import width
from capstan.v1 import admin_pb2 as pb

STATIC_HELP = (
    "a static topic: --queues logic queues spread over the broker groups (--groups, default "
    "every group), which keep their ids and offsets when queues move between groups"
)


def add_create_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--static", action="store_true", help=STATIC_HELP)
    parser.add_argument(
        "--groups",
        default="",
        metavar="A,B",
        help="with --static: the broker groups to spread the logic queues over",
    )


def static_groups(groups_flag: str) -> list[str]:
    """The groups `--groups` names (none: every group)."""
    return [g for g in (part.strip() for part in groups_flag.split(",")) if g]


def mapping_or_none(admin: BlockingAdminClient, topic: str) -> pb.QueueMappingReply | None:
    """The topic's queue mapping, None for a topic that is not static."""
    try:
        reply: pb.QueueMappingReply = admin.get_queue_mapping(topic)
    except ClientError as exc:
        if exc.code == "NOT_FOUND":
            return None
        raise
    return reply


def print_mapping(mapping: pb.QueueMapping) -> None:
    """The mapping as a table: one row per item of each logic queue, oldest first."""
    print(
        f"static topic {mapping.topic}: {len(mapping.queues)} logic queues, epoch {mapping.epoch}"
    )
    rows = [(q, item) for q, queue in enumerate(mapping.queues) for item in queue.items]
    g = width("GROUP", (item.group for _, item in rows))
    print(
        f"  {'QUEUE':>5} {'GEN':>4} {'GROUP':{g}} {'PHYSICAL':>8} {'LOGIC FROM':>10} "
        f"{'PHYS FROM':>10} {'PHYS END':>10}  STATE"
    )
    for q, item in rows:
        print(
            f"  {q:>5} {item.gen:>4} {item.group:{g}} {item.queue_id:>8} "
            f"{_offset(item.logic_offset):>10} {_offset(item.start_offset):>10} "
            f"{_offset(item.end_offset):>10}  {_state(item)}"
        )


def _offset(value: int) -> str:
    return "-" if value < 0 else str(value)


def _state(item: pb.MappingItem) -> str:
    if item.logic_offset == -1:
        return "pending (moving here)"
    if item.end_offset == -2:
        return "sealed (moving away)"
    return "takes writes" if item.end_offset == -1 else "read only"
