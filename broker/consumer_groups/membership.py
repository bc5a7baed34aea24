"""Who is in each consumer group of the SDK, and telling the members when that changes.

A member is known from its heartbeats (RocketMQ's ConsumerManager). It leaves when it
unregisters, when its WatchGroup stream ends, or when it has been silent for the expiry
time. Every join or leave bumps the group's version and wakes the group's watchers, which
is how the surviving clients learn to rebalance at once instead of at their next 20 s
timer (RocketMQ's NOTIFY_CONSUMER_IDS_CHANGED).

RocketMQ keeps one subscription per group and silently takes the latest heartbeat's when
members disagree (seed 000). Here each member keeps its own; `inconsistency` names the
members that disagree so the broker can log, count and show it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from capstan.common.aio_wait import wait_event

Subscriptions = tuple[tuple[str, str], ...]
"""(topic, expression) pairs, sorted by topic."""


@dataclass
class Member:
    client_id: str
    message_model: int
    consume_type: int
    orderly: bool
    subscriptions: Subscriptions
    owned: tuple[tuple[str, str, int], ...] = ()
    """(topic, broker name, queue id) the client consumes, as of its last heartbeat."""
    last_heartbeat: float = field(default_factory=time.monotonic)


@dataclass
class _Group:
    members: dict[str, Member] = field(default_factory=dict)
    version: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    reset_id: int = 0
    resets: list[tuple[int, tuple[tuple[str, int, int], ...]]] = field(default_factory=list)
    """The latest offset resets, oldest first: (id, (topic, queue id, offset) per queue)."""

    def bump(self) -> None:
        self.version += 1
        # Wake everyone waiting on this version, then give later waiters a fresh event.
        self.changed.set()
        self.changed = asyncio.Event()


def normalize(subscriptions: Iterable[tuple[str, str]]) -> Subscriptions:
    """One expression per topic ("" and "*" both mean every tag), sorted by topic."""
    table = {topic: (expr.strip() or "*") for topic, expr in subscriptions}
    return tuple(sorted(table.items()))


def inconsistency(members: Iterable[Member]) -> str:
    """Empty when every member subscribes alike; else which clients subscribe how."""
    variants: dict[Subscriptions, list[str]] = {}
    for m in members:
        variants.setdefault(m.subscriptions, []).append(m.client_id)
    if len(variants) <= 1:
        return ""
    parts = []
    for subs, clients in sorted(variants.items(), key=lambda item: sorted(item[1])):
        what = ", ".join(f"{t} {e!r}" for t, e in subs) or "nothing"
        parts.append(f"{', '.join(sorted(clients))} subscribe to {what}")
    return "; ".join(parts)


RESETS_KEPT = 64
"""Offset resets remembered per group, for watchers that have not yet seen them."""


class GroupMembership:
    """The members of every group; use from the broker's event loop only."""

    def __init__(self, expiry_s: float) -> None:
        self.expiry_s = expiry_s
        self._groups: dict[str, _Group] = {}

    def _group(self, name: str) -> _Group:
        group = self._groups.get(name)
        if group is None:
            group = self._groups[name] = _Group()
        return group

    def heartbeat(self, group_name: str, member: Member) -> tuple[bool, int]:
        """Record a heartbeat; (whether the group's membership or a subscription changed,
        the group's version afterwards)."""
        group = self._group(group_name)
        old = group.members.get(member.client_id)
        group.members[member.client_id] = member
        changed = (
            old is None
            or old.subscriptions != member.subscriptions
            or old.message_model != member.message_model
        )
        if changed:
            group.bump()
        return changed, group.version

    def remove(self, group_name: str, client_id: str) -> bool:
        group = self._groups.get(group_name)
        if group is None or group.members.pop(client_id, None) is None:
            return False
        group.bump()
        return True

    def expire(self, now: float | None = None) -> list[tuple[str, str]]:
        """Drop members silent for longer than the expiry; the (group, client) pairs."""
        now = time.monotonic() if now is None else now
        gone = []
        for name, group in self._groups.items():
            silent = [c for c, m in group.members.items() if now - m.last_heartbeat > self.expiry_s]
            for cid in silent:
                del group.members[cid]
                gone.append((name, cid))
            if silent:
                group.bump()
        return gone

    def members(self, group_name: str) -> list[Member]:
        group = self._groups.get(group_name)
        if group is None:
            return []
        return [group.members[cid] for cid in sorted(group.members)]

    def is_member(self, group_name: str, client_id: str) -> bool:
        group = self._groups.get(group_name)
        return group is not None and client_id in group.members

    def version(self, group_name: str) -> int:
        group = self._groups.get(group_name)
        return 0 if group is None else group.version

    async def wait_change(self, group_name: str, seen_version: int, timeout_s: float) -> int:
        """Wait until the group's version differs from `seen_version` (or the timeout);
        the version then."""
        group = self._group(group_name)
        if group.version == seen_version:
            await wait_event(group.changed, timeout_s)
        return group.version

    def announce_reset(self, group_name: str, offsets: Iterable[tuple[str, int, int]]) -> int:
        """An admin moved the group's committed offsets; wake the watchers so the members
        hear of it. The reset's id."""
        group = self._group(group_name)
        group.reset_id += 1
        group.resets.append((group.reset_id, tuple(offsets)))
        del group.resets[:-RESETS_KEPT]
        group.bump()
        return group.reset_id

    def last_reset_id(self, group_name: str) -> int:
        group = self._groups.get(group_name)
        return 0 if group is None else group.reset_id

    def resets_since(self, group_name: str, seen_id: int) -> tuple[int, list[tuple[str, int, int]]]:
        """(the latest reset id, the offsets reset after `seen_id`, a later reset of a
        queue winning over an earlier one)."""
        group = self._group(group_name)
        table: dict[tuple[str, int], int] = {}
        for reset_id, offsets in group.resets:
            if reset_id > seen_id:
                for topic, qid, offset in offsets:
                    table[(topic, qid)] = offset
        return group.reset_id, [(t, q, o) for (t, q), o in sorted(table.items())]

    def wake_all(self) -> None:
        """Release every watcher (the broker is stopping)."""
        for group in self._groups.values():
            group.bump()

    def group_names(self) -> list[str]:
        return sorted(name for name, g in self._groups.items() if g.members)
