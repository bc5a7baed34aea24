"""ReceiveMessage (long polling), AckMessage, ChangeInvisibleDuration and
ForwardMessageToDeadLetterQueue. A refusal is raised as a RequestError, which the servicer
answers in the RPC's shape (messaging_servicer.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.catalog import Catalog
from capstan.broker.edge.forwarding import older_items_for
from capstan.broker.edge.v2 import validation
from capstan.broker.edge.v2.codes import RequestError, combined, ok, put_status, status
from capstan.broker.edge.v2.older_items import OlderItems, unwrap
from capstan.broker.edge.v2.wire import fill_wire, ms_to_timestamp
from capstan.broker.long_polling import ArrivalNotifier, suspend_s
from capstan.broker.metrics import BrokerMetrics
from capstan.broker.pop.pop_service import HandleError, PopService, Put
from capstan.broker.static_topics import StaticTopics
from capstan.broker.store.subscription_groups import SubscriptionGroupConfig
from capstan.broker.store.topic_config import TopicConfig
from capstan.common.broker_settings import PopSettings
from capstan.common.clock import now_ms


class ConsumeHandler:
    def __init__(
        self,
        catalog: Catalog,
        pop: PopService,
        arrivals: ArrivalNotifier,
        put_dead_letter: Put,
        metrics: BrokerMetrics,
        settings: PopSettings,
        store_host: str,
        static: StaticTopics,
        older: OlderItems,
        on_slaves: Callable[[float | None], Awaitable[None]] | None = None,
    ) -> None:
        """`store_host` is this broker's address as stored messages name it; `older`
        reaches the groups that keep older items of the static topics' logic queues this
        group leads; `on_slaves` returns once the slaves hold the pop state as it is now
        (Broker.pop_state_on_slaves, given the time left before the client's deadline),
        awaited before a receive, an ack or a changed invisible time is answered."""
        self._on_slaves = on_slaves
        self._static = static
        self._older = older
        self._catalog = catalog
        self._pop = pop
        self._arrivals = arrivals
        self._put_dead_letter = put_dead_letter
        self._metrics = metrics
        self._settings = settings
        self._store_host = store_host

    async def _replicated(self, context: grpc.aio.ServicerContext) -> None:
        if self._on_slaves is not None:
            await self._on_slaves(context.time_remaining())

    def _group_and_topic(
        self, group: pb.Resource, topic: pb.Resource
    ) -> tuple[SubscriptionGroupConfig, TopicConfig]:
        validation.group_name(group)
        validation.topic_name(topic)  # both names are checked before either lookup
        config = validation.existing_group(self._catalog, group)
        return config, validation.existing_topic(self._catalog, topic)

    # -- receive -----------------------------------------------------------------------

    async def receive(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        group, topic, tags, invisible_ms, wait_s = self._receive_args(request, context)
        pop = self._pop
        batch = min(request.batch_size, self._settings.max_batch_size)
        static = self._static.view(topic.name)
        only: frozenset[int] | None = None
        older: tuple[str, ...] = ()
        newer: tuple[str, ...] = ()
        asker = older_items_for(context)
        if asker is not None:  # another group of the queues asks: answer at once
            wait_s = 0.0
            only = static.shared_with(asker) if static is not None else frozenset()
        elif static is not None:
            older, newer = static.older_groups, static.newer_groups
        deadline = time.monotonic() + wait_s
        while True:
            if older:  # first, so a queue's older items are drained before its newer ones
                passed = await self._older.receive(older, request, context)
                if passed:
                    async for answer in _passed_answers(passed):
                        yield answer
                    return
            # Any queue of the topic may serve it: the named queue only chose this broker.
            got = pop.receive(group, topic, tags, batch, invisible_ms, only)
            if not got and newer:  # a client whose route still names this group
                passed = await self._older.receive(newer, request, context)
                if passed:
                    async for answer in _passed_answers(passed):
                        yield answer
                    return
            remaining = deadline - time.monotonic()
            if got or remaining <= 0 or self._arrivals.closed:
                break
            due = pop.next_due_ms(group, topic)
            if due is not None:
                remaining = min(remaining, max(0.0, (due - now_ms()) / 1000) + 0.005)
            if older or newer:
                look = self._older.next_look_s(older + newer, group.group_name, topic.name)
                remaining = min(remaining, look + 0.005)
            await self._arrivals.wait([topic.name], remaining)
        if not got:
            yield svc.ReceiveMessageResponse(status=status(pb.MESSAGE_NOT_FOUND, "no new message"))
            return
        answered = False
        try:
            await self._replicated(context)
            yield svc.ReceiveMessageResponse(status=ok())
            host = self._store_host
            size = 0
            logic = static.logic_offset if static is not None else None
            for item in got:
                m = item.message
                size += len(m.body)
                if logic is not None and m.topic == topic.name:  # read for this answer alone:
                    m.queue_offset = logic(m.queue_id, m.queue_offset)  # its logic offset
                response = svc.ReceiveMessageResponse()
                fill_wire(response.message, m, host, item.delivery, topic=topic.name)
                yield response
                if item.delivery.delivery_attempt > 1:
                    self._metrics.redeliveries.labels(group.group_name).inc()
            self._metrics.count_out(topic.name, len(got), size)
            yield svc.ReceiveMessageResponse(delivery_timestamp=ms_to_timestamp(now_ms()))
            answered = True
        finally:
            # An answer cut short (the client's deadline passed while the slaves caught up,
            # the call was cancelled, the stream broke) reached no consumer: a client drops
            # a receive that ends in an error, so its messages are due again now, not after
            # their invisible time.
            if not answered:
                pop.give_back(group.group_name, topic.name, got)

    def _receive_args(
        self, request: svc.ReceiveMessageRequest, context: grpc.aio.ServicerContext
    ) -> tuple[SubscriptionGroupConfig, TopicConfig, set[str] | None, int, float]:
        settings = self._settings
        group, topic = self._group_and_topic(request.group, request.message_queue.topic)
        if not topic.readable:
            raise RequestError(pb.FORBIDDEN, f"topic {topic.name!r} is not readable")
        tags = validation.tag_filter(request.filter_expression)
        if request.batch_size <= 0:
            raise RequestError(pb.BAD_REQUEST, "batch_size must be positive")
        if request.HasField("invisible_duration"):
            invisible_ms = request.invisible_duration.ToMilliseconds()
        elif request.auto_renew:
            invisible_ms = settings.auto_renew_invisible_ms
        else:
            raise RequestError(pb.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required")
        if not settings.min_invisible_ms <= invisible_ms <= settings.max_invisible_ms:
            raise RequestError(
                pb.ILLEGAL_INVISIBLE_TIME,
                f"invisible duration {invisible_ms} ms is outside "
                f"{settings.min_invisible_ms}..{settings.max_invisible_ms} ms",
            )
        wait_ms = settings.max_long_polling_ms
        if request.HasField("long_polling_timeout"):
            wait_ms = request.long_polling_timeout.ToMilliseconds()
            if not settings.min_long_polling_ms <= wait_ms:
                raise RequestError(
                    pb.ILLEGAL_POLLING_TIME,
                    f"long polling timeout must be at least {settings.min_long_polling_ms} ms",
                )
        wait_s = suspend_s(wait_ms, settings.max_long_polling_ms, context.time_remaining())
        return group, topic, tags, invisible_ms, wait_s

    # -- ack and friends ---------------------------------------------------------------

    def _handed_out_by(self, topic: str, handle: str) -> str | None:
        """The other group that made `handle` (a message it handed out through this one:
        older_items.py); None for this broker's own handles. HandleError for a handle that
        names a group the topic's mapping does not, or this group."""
        found = unwrap(handle)
        if found is None:
            return None
        static = self._static.view(topic)
        if static is None or found[0] == static.group or found[0] not in static.mapping.groups():
            raise HandleError(
                f"the receipt handle names group {found[0][:64]!r}, not one of "
                f"topic {topic!r}'s other groups"
            )
        return found[0]

    def _handed_out_for(self, topic: str, handle: str) -> str | None:
        """`_handed_out_by`, a bad handle refused as INVALID_RECEIPT_HANDLE."""
        try:
            return self._handed_out_by(topic, handle)
        except HandleError as exc:
            raise RequestError(pb.INVALID_RECEIPT_HANDLE, str(exc)) from None

    async def ack(
        self, request: svc.AckMessageRequest, context: grpc.aio.ServicerContext
    ) -> svc.AckMessageResponse:
        group, topic = self._group_and_topic(request.group, request.topic)
        if not request.entries:
            raise RequestError(pb.BAD_REQUEST, "no entries to acknowledge")
        results: list[svc.AckMessageResultEntry | None] = []
        pop = self._pop
        freed = False
        elsewhere: dict[str, list[int]] = {}  # handles of older items' groups, by group
        for entry in request.entries:
            try:
                other = self._handed_out_by(topic.name, entry.receipt_handle)
                if other is not None:
                    elsewhere.setdefault(other, []).append(len(results))
                    results.append(None)
                    continue
                freed |= pop.ack(group.group_name, topic.name, entry.receipt_handle, write=False)
                st = ok()
            except HandleError as exc:
                st = status(pb.INVALID_RECEIPT_HANDLE, str(exc))
            results.append(
                svc.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=st
                )
            )
        pop.write_journal()  # one journal write for the batch, before answering
        await self._replicated(context)
        if freed and group.consume_message_orderly:
            self._arrivals.notify(topic.name)  # a waiting receive may take its next
        for other, places in elsewhere.items():
            entries = [request.entries[i] for i in places]
            passed = await self._older.ack(other, request, entries, context)
            for i, result in zip(places, passed, strict=True):
                results[i] = result
        answered = [r for r in results if r is not None]
        code = combined([r.status.code for r in answered])
        top = answered[0].status if code == answered[0].status.code else status(code, "see entries")
        return svc.AckMessageResponse(status=top, entries=answered)

    async def change_invisible(
        self, request: svc.ChangeInvisibleDurationRequest, context: grpc.aio.ServicerContext
    ) -> svc.ChangeInvisibleDurationResponse:
        group, topic = self._group_and_topic(request.group, request.topic)
        other = self._handed_out_for(topic.name, request.receipt_handle)
        if other is not None:  # a message another group handed out through this one
            return await self._older.change_invisible(other, request, context)
        invisible_ms = request.invisible_duration.ToMilliseconds()
        limit = self._settings.max_invisible_ms
        if not 0 <= invisible_ms <= limit or not request.HasField("invisible_duration"):
            raise RequestError(
                pb.ILLEGAL_INVISIBLE_TIME, f"invisible duration must be within 0..{limit} ms"
            )
        try:
            new = self._pop.change_invisible(
                group.group_name, topic.name, request.receipt_handle, invisible_ms
            )
        except HandleError as exc:
            raise RequestError(pb.INVALID_RECEIPT_HANDLE, str(exc)) from None
        # The message may come due sooner than a waiting receive was told: let it look again.
        self._arrivals.notify(topic.name)
        await self._replicated(context)
        return svc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=new)

    async def forward_to_dlq(
        self,
        request: svc.ForwardMessageToDeadLetterQueueRequest,
        context: grpc.aio.ServicerContext,
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        group, topic = self._group_and_topic(request.group, request.topic)
        other = self._handed_out_for(topic.name, request.receipt_handle)
        if other is not None:  # a message another group handed out through this one
            return await self._older.forward_to_dlq(other, request, context)
        try:
            result = await self._pop.forward_to_dlq(
                group.group_name, topic.name, request.receipt_handle, self._put_dead_letter
            )
        except HandleError as exc:
            raise RequestError(pb.INVALID_RECEIPT_HANDLE, str(exc)) from None
        if group.consume_message_orderly and result.status.ok:
            self._arrivals.notify(topic.name)  # its queue may hand out again
        return svc.ForwardMessageToDeadLetterQueueResponse(status=put_status(result))


async def _passed_answers(
    messages: list[svc.ReceiveMessageResponse],
) -> AsyncIterator[svc.ReceiveMessageResponse]:
    """A receive's answers for messages another group handed out (older_items.py)."""
    yield svc.ReceiveMessageResponse(status=ok())
    for answer in messages:
        yield answer
    yield svc.ReceiveMessageResponse(delivery_timestamp=ms_to_timestamp(now_ms()))


def change_invisible_refused(
    request: svc.ChangeInvisibleDurationRequest, refusal: pb.Status
) -> svc.ChangeInvisibleDurationResponse:
    """The Python client keeps whatever handle comes back, even on failure: echo the old."""
    return svc.ChangeInvisibleDurationResponse(
        status=refusal, receipt_handle=request.receipt_handle
    )
