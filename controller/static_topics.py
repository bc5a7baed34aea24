"""Static topics on the controller: making one, moving a logic queue, and keeping every
group of a static topic in step with the book (static_topic_book.py).

Every flow records a mapping in the book before any broker acts on it, then hands it to
the groups (`SetQueueMapping`); a broker keeps a mapping only when its epoch is newer. So
whatever fails, the book holds the truth, and handing its mapping on again is harmless:
`keep` does that for every group that is behind, and finishes a move that stopped between
its two steps (docs/static_topics.md).

The flows call the groups through an `Ask` (the admin front's, passing the caller's
signature and deadline, or the controller's own, signed as the cluster) and refuse with
`Refused`, naming the problem.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from capstan.client.queue_mapping_wire import mapping_to_wire
from capstan.common.queue_mapping import (
    MAX_LOGIC_QUEUES,
    MappingError,
    QueueMapping,
    begin_move,
    drop_read_items,
    finish_move,
    new_mapping,
    retire_group,
)
from capstan.controller.group_answers import (
    NO_GROUPS,
    GroupOutcome,
    Refusal,
    Refused,
    change_refusal,
    not_found,
    read_refusal,
)
from capstan.controller.static_topic_book import MappingMoved, StaticTopicBook
from capstan.v1 import admin_pb2 as pb

log = logging.getLogger(__name__)

Ask = Callable[[str, Any, Sequence[str] | None], Awaitable[list[GroupOutcome]]]
"""`method` with `request` on the groups named (None: every registered group): each
group's outcome, in group-name order."""


class StaticTopics:
    def __init__(self, book: StaticTopicBook, group_names: Callable[[], list[str]]) -> None:
        self.book = book
        self._group_names = group_names
        self._cleanups: set[asyncio.Task[None]] = set()
        """Deletions from retired groups, running (held here so they are not collected)."""
        self._moves = asyncio.Lock()
        """One change of a static topic at a time on this controller (the book's
        compare-and-swap guards against other controller replicas)."""

    # -- making one ----------------------------------------------------------------------

    async def create(
        self, ask: Ask, topic: pb.Topic, groups: Sequence[str]
    ) -> tuple[QueueMapping, list[GroupOutcome]]:
        """Decide the mapping, record it, then hand it to every group of the topic. Asked
        again after a partial failure, the same mapping is handed on again."""
        mapping = await self._new_mapping(topic, groups)
        name = mapping.topic
        async with self._moves:
            held = await asyncio.to_thread(self.book.get, name)
            if held is not None and held != mapping:
                raise Refused(
                    Refusal(
                        grpc.StatusCode.ALREADY_EXISTS,
                        f"static topic {name!r} exists (epoch {held.epoch}, groups "
                        f"{', '.join(held.groups())})",
                    )
                )
            if held is None:
                await refuse_a_normal_topic(ask, name, None)
                await asyncio.to_thread(self.book.put, mapping, None)
            given = pb.SetQueueMappingRequest(topic=topic, mapping=mapping_to_wire(mapping))
            outcomes = await ask("SetQueueMapping", given, mapping.groups())
            refusal = change_refusal(f"CreateStaticTopic {name!r}", outcomes)
            if refusal is not None and all(
                o.code is grpc.StatusCode.INVALID_ARGUMENT for o in outcomes
            ):  # no group took it: the topic was never made
                await asyncio.to_thread(self.book.delete, name)
        if refusal is not None:
            raise Refused(refusal)
        return mapping, outcomes

    async def _new_mapping(self, topic: pb.Topic, groups: Sequence[str]) -> QueueMapping:
        total = topic.write_queue_nums or topic.read_queue_nums
        registered = await asyncio.to_thread(self._group_names)
        chosen = list(groups) or registered
        unknown = [g for g in chosen if g not in registered]
        if not topic.name:
            raise Refused(Refusal(grpc.StatusCode.INVALID_ARGUMENT, "a static topic needs a name"))
        if not 1 <= total <= MAX_LOGIC_QUEUES:
            raise Refused(
                Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"a static topic needs 1..{MAX_LOGIC_QUEUES} logic queues "
                    f"(write_queue_nums), got {total}",
                )
            )
        if unknown:
            raise Refused(_unregistered(unknown[0], registered))
        if not chosen:
            raise Refused(Refusal(grpc.StatusCode.UNAVAILABLE, NO_GROUPS))
        try:
            return new_mapping(topic.name, total, chosen)
        except MappingError as exc:
            raise Refused(Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc))) from exc

    # -- moving a logic queue --------------------------------------------------------------

    async def remap(self, ask: Ask, topic: str, queue: int, to: str) -> QueueMapping:
        """Move a logic queue's writes to group `to`: seal it (recorded, then handed to
        its group, whose answer says where the queue stopped), then open it on `to` at the
        next logic offset (recorded, then handed to every group of the topic). Asked again,
        a move that stopped between the steps is finished; one already made changes
        nothing."""
        held = await asyncio.to_thread(self.book.get, topic)
        registered = await asyncio.to_thread(self._group_names)
        if held is None:
            raise Refused(Refusal(grpc.StatusCode.NOT_FOUND, f"no static topic {topic!r}"))
        if not 0 <= queue < held.total_queues:
            raise Refused(
                Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"static topic {topic!r} has no logic queue {queue} "
                    f"(0..{held.total_queues - 1})",
                )
            )
        if to not in registered:
            raise Refused(_unregistered(to, registered))
        async with self._moves:
            held = await asyncio.to_thread(self.book.get, topic)
            assert held is not None
            return await self._move(ask, held, queue, to)

    async def _move(self, ask: Ask, held: QueueMapping, queue: int, to: str) -> QueueMapping:
        try:
            begun = begin_move(held, queue, to)
        except MappingError as exc:
            raise Refused(Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(exc))) from exc
        config = await static_config(ask, held)
        if to not in held.groups():  # before anything is recorded: can `to` take it?
            await refuse_a_normal_topic(ask, held.topic, [to])
        if begun is not held:
            await self._record(begun, held.epoch)
        if begun.leader(queue).takes_writes:  # there already: every group holds it?
            await hand_over(ask, config, begun, begun.groups())
            return begun
        return await self._finish(ask, config, begun, queue)

    async def _finish(
        self, ask: Ask, config: pb.Topic, begun: QueueMapping, queue: int
    ) -> QueueMapping:
        sealed, pending = begun.items(queue)[-2:]
        old_end = await queue_end(ask, config, begun, sealed.group, queue)
        new_start = await queue_end(ask, config, begun, pending.group, queue)
        done = finish_move(begun, queue, old_end, new_start)
        await self._record(done, begun.epoch)
        await hand_over(ask, config, done, done.groups())
        log.info(
            "static topic %s: logic queue %d moved from %s (ends at %d) to %s (from %d)",
            done.topic,
            queue,
            sealed.group,
            old_end,
            pending.group,
            new_start,
        )
        return done

    async def retire(self, ask: Ask, topic: str, group: str) -> QueueMapping:
        """Take drained group `group` out of the topic's mapping (`retire_group`): the new
        mapping is recorded, then handed to the topic's other groups, and the topic is
        deleted from `group` if it can still be reached (it would go on answering routes
        for the queues it held). Refused while it leads or is about to lead a queue."""
        async with self._moves:
            held = await asyncio.to_thread(self.book.get, topic)
            if held is None:
                raise Refused(Refusal(grpc.StatusCode.NOT_FOUND, f"no static topic {topic!r}"))
            try:
                retired = retire_group(held, group)
            except MappingError as exc:
                raise Refused(Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(exc))) from exc
            if retired is held:
                return held
            config = await static_config(ask, held)
            await self._record(retired, held.epoch)
            await hand_over(ask, config, retired, retired.groups())
        log.info("static topic %s: group %s retired (epoch %d)", topic, group, retired.epoch)
        # In the background: a group that is gone may hold the call until its timeout, and
        # the caller's own deadline would end first (it would see the retire fail).
        task = asyncio.get_running_loop().create_task(self._delete_from(ask, topic, group))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return retired

    async def _delete_from(self, ask: Ask, topic: str, group: str) -> None:
        gone = await ask("DeleteTopic", pb.TopicRequest(name=topic), [group])
        if gone and not gone[0].ok and gone[0].code is not grpc.StatusCode.NOT_FOUND:
            log.warning(
                "static topic %s: group %s retired, but deleting the topic there failed: %s",
                topic,
                group,
                gone[0].detail,
            )

    async def _record(self, mapping: QueueMapping, decided_from: int) -> None:
        try:
            await asyncio.to_thread(self.book.put, mapping, decided_from)
        except MappingMoved as exc:
            raise Refused(Refusal(grpc.StatusCode.ABORTED, str(exc))) from exc

    # -- keeping the groups in step --------------------------------------------------------

    async def keep(self, ask: Ask) -> None:
        """Finish every move that stopped between its steps, and hand each static topic's
        mapping to its groups that hold an older one (a group that was down, a master
        that lost it with an unreplicated change)."""
        for mapping in await asyncio.to_thread(self.book.all):
            try:
                async with self._moves:
                    await self._keep_one(ask, mapping)
            except Refused as exc:
                log.warning("static topic %s: %s", mapping.topic, exc.refusal.detail)

    async def _keep_one(self, ask: Ask, mapping: QueueMapping) -> None:
        current = await asyncio.to_thread(self.book.get, mapping.topic)
        if current is None:
            return
        config = await static_config(ask, current)
        for queue in current.moving():
            current = await self._finish(ask, config, current, queue)
        request = pb.QueueMappingRequest(topic=current.topic)
        held = await ask("GetQueueMapping", request, current.groups())
        current = await self._drop_read(ask, config, current, held)
        behind = [
            o.group
            for o in held
            if o.group in current.groups() and (not o.ok or o.reply.mapping.epoch < current.epoch)
        ]
        if behind:
            log.info(
                "static topic %s: handing epoch %d to %s", current.topic, current.epoch, behind
            )
            await hand_over(ask, config, current, behind)

    async def _drop_read(
        self, ask: Ask, config: pb.Topic, current: QueueMapping, held: list[GroupOutcome]
    ) -> QueueMapping:
        """`current` without the oldest items whose messages retention removed on their
        group (`drop_read_items`, from the physical bounds each group answered), recorded
        and handed to the groups; a group left with no item has the topic deleted."""
        trimmed = current
        for outcome in held:
            if outcome.ok and outcome.group in current.groups():
                for q in outcome.reply.topic.queues:
                    trimmed = drop_read_items(trimmed, outcome.group, q.queue_id, q.min_offset)
        if trimmed is current:
            return current
        await self._record(trimmed, current.epoch)
        await hand_over(ask, config, trimmed, trimmed.groups())
        emptied = [g for g in current.groups() if g not in trimmed.groups()]
        if emptied:
            await ask("DeleteTopic", pb.TopicRequest(name=current.topic), emptied)
        log.info(
            "static topic %s: items retention emptied dropped (epoch %d)%s",
            current.topic,
            trimmed.epoch,
            f"; no item left on {', '.join(emptied)}" if emptied else "",
        )
        return trimmed


async def static_config(ask: Ask, mapping: QueueMapping) -> pb.Topic:
    """The static topic's config (type, perm, attributes) as its groups hold it: from the
    first group that answers, asked one at a time (a group that is down costs a move
    nothing when another one answers first)."""
    request = pb.TopicRequest(name=mapping.topic)
    outcomes: list[GroupOutcome] = []
    for group in mapping.groups():
        outcomes += await ask("DescribeTopic", request, [group])
        if outcomes and outcomes[-1].ok:
            config = pb.Topic()
            config.CopyFrom(outcomes[-1].reply.topic.topic)
            config.read_queue_nums = config.write_queue_nums = mapping.total_queues
            return config
    refusal = read_refusal(f"DescribeTopic {mapping.topic!r}", outcomes, True)
    raise Refused(refusal or not_found(outcomes))


async def refuse_a_normal_topic(ask: Ask, name: str, groups: Sequence[str] | None) -> None:
    """A static topic's name found on a group it is not on yet is a normal topic's."""
    outcomes = await ask("DescribeTopic", pb.TopicRequest(name=name), groups)
    refusal = read_refusal(f"DescribeTopic {name!r}", outcomes, True)
    if refusal is not None:
        raise Refused(refusal)
    found = [o.group for o in outcomes if o.ok]
    if found:
        raise Refused(
            Refusal(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"topic {name!r} exists as a normal topic on {', '.join(found)}; "
                "a static topic needs a name of its own",
            )
        )


async def queue_end(
    ask: Ask, config: pb.Topic, mapping: QueueMapping, group: str, queue: int
) -> int:
    """Hand `mapping` to `group`; where its physical queue `queue` ends once it holds it
    (a group sealed by it takes no more writes there)."""
    given = pb.SetQueueMappingRequest(topic=config, mapping=mapping_to_wire(mapping))
    outcomes = await ask("SetQueueMapping", given, [group])
    refusal = change_refusal(f"SetQueueMapping {mapping.topic!r}", outcomes)
    if refusal is not None:
        raise Refused(refusal)
    ends = [q.max_offset for q in outcomes[0].reply.topic.queues if q.queue_id == queue]
    return ends[0] if ends else 0


async def hand_over(
    ask: Ask, config: pb.Topic, mapping: QueueMapping, groups: Sequence[str]
) -> None:
    given = pb.SetQueueMappingRequest(topic=config, mapping=mapping_to_wire(mapping))
    outcomes = await ask("SetQueueMapping", given, groups)
    refusal = change_refusal(f"SetQueueMapping {mapping.topic!r}", outcomes)
    if refusal is not None:
        raise Refused(refusal)


def _unregistered(group: str, registered: Sequence[str]) -> Refusal:
    return Refusal(
        grpc.StatusCode.NOT_FOUND,
        f"broker group {group!r} is not registered with this controller "
        f"(registered: {', '.join(registered) or 'none'})",
    )
