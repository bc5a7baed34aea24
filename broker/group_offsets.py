"""Where consumer groups stand, as an operator asks: each group's position on each queue
(committed offset, lag, messages in flight), what this broker holds that readers may still
want, and moving a group's offsets (to the earliest, the latest, or a point in time).

The decisions live here; the admin servicer (edge/v1/admin_servicer.py) checks the request,
calls them and turns the answer into its reply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from capstan.broker.client_offsets import ClientOffsets
from capstan.broker.consumer_groups.membership import GroupMembership
from capstan.broker.pop.pop_service import PopService
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.topic_config import TopicConfig
from capstan.broker.system_topics import is_system_topic


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A group's position on one queue."""

    topic: str
    queue_id: int
    committed: int
    max_offset: int
    lag: int
    """Messages between the committed offset (or the queue's first, if above) and its end."""
    inflight: int = 0
    """Received by the group's simple consumers and not yet acknowledged."""


@dataclass(frozen=True, slots=True)
class ResetTarget:
    """Where a reset moves a group: `where` is "earliest", "latest" or "timestamp" (the first
    message stored at or after `timestamp_ms`, or the queue's end when none is)."""

    where: str
    timestamp_ms: int = 0

    def __post_init__(self) -> None:
        if self.where not in ("earliest", "latest", "timestamp"):
            raise ValueError(f"a reset goes to earliest, latest or a timestamp, not {self.where}")


class GroupOffsets:
    def __init__(
        self,
        store: MessageStore,
        offsets: ClientOffsets,
        pop: PopService,
        members: GroupMembership,
        is_master: Callable[[], bool],
    ) -> None:
        """`offsets` turns the store's offsets into the ones clients see (the logic
        offsets of a static topic's queues); lags are counted in messages either way."""
        self._store = store
        self._offsets = offsets
        self._pop = pop
        self._members = members
        self._is_master = is_master

    def take_acks(self) -> None:
        """Take the acks of receive/ack consumption into the committed offsets now, not at
        the next housekeeping round, so a group acked a moment ago shows no lag."""
        if self._is_master():
            self._pop.commit_offsets()

    def positions(self, group: str) -> list[QueuePosition]:
        """Every queue the group has committed an offset on, by topic and queue id."""
        found = []
        for (topic, qid), committed in sorted(
            self._store.consumer_offsets.offsets_of_group(group).items()
        ):
            low, high = self._store.queue_bounds(topic, qid) or (0, 0)
            client = self._offsets.to_client
            found.append(
                QueuePosition(
                    topic,
                    qid,
                    client(topic, qid, committed),
                    client(topic, qid, high),
                    max(0, high - max(committed, low)),
                    self._pop.in_flight(group, topic, qid),
                )
            )
        return found

    def unconsumed(self) -> int:
        """Messages of user, retry and dead-letter topics that a reader may still want:
        past the lowest committed offset of the groups that consumed a queue, or the whole
        queue when no group has."""
        offsets = self._store.consumer_offsets
        lowest: dict[tuple[str, int], int] = {}
        for group in offsets.groups():
            for key, committed in offsets.offsets_of_group(group).items():
                lowest[key] = min(committed, lowest.get(key, committed))
        total = 0
        for config in self._store.topics.all():
            if is_system_topic(config.name):
                continue
            for qid in range(max(config.read_queue_nums, config.write_queue_nums)):
                low, high = self._store.queue_bounds(config.name, qid) or (0, 0)
                total += max(0, high - max(low, lowest.get((config.name, qid), low)))
        return total

    def reset(self, group: str, topic: TopicConfig, target: ResetTarget) -> list[QueuePosition]:
        """Move the group's offset on every readable queue of `topic` to `target`, drop
        what it has in flight there, and tell its members consuming now (they hold offsets
        in memory and would commit them over these). The new positions."""
        moved = []
        for qid in range(topic.read_queue_nums):
            low, high = self._store.queue_bounds(topic.name, qid) or (0, 0)
            if target.where == "earliest":
                offset = low
            elif target.where == "latest":
                offset = high
            else:
                found = self._store.offset_for_time(topic.name, qid, target.timestamp_ms)
                offset = high if found is None else found
            self._store.consumer_offsets.commit(group, topic.name, qid, offset)
            self._pop.reset(group, topic.name, qid, offset)
            client = self._offsets.to_client
            moved.append(
                QueuePosition(
                    topic.name,
                    qid,
                    client(topic.name, qid, offset),
                    client(topic.name, qid, high),
                    high - offset,
                )
            )
        self._members.announce_reset(group, [(p.topic, p.queue_id, p.committed) for p in moved])
        return moved
