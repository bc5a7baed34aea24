"""The one way messages enter this broker's store: sends, timer deliveries, transaction
commits, dead letters and writes passed on by a peer all call `WritePath.put`, or `admit`
and later `put_admitted` when a request must be checked whole before any part is stored.

In order, once each: the store admits the batch (store/admission.py: body, topic, queue,
record size); a broker that does not lead its group refuses (waiting first while its
leadership is being handed over); a replicated write needs enough replicas in sync; the
store appends the batch (store/async_append.py); a replicated write then waits for its
copies and, with SYNC_FLUSH, its fsync, both at once. What was stored is counted and wakes
the long polls on its topics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from capstan.broker.catalog import Catalog
from capstan.broker.long_polling import ArrivalNotifier
from capstan.broker.metrics import BrokerMetrics
from capstan.broker.replication.ack_policy import AckOutcome
from capstan.broker.replication.acting_master import ActingMaster
from capstan.broker.replication.escape import EscapeBridge
from capstan.broker.replication.handover import LeadershipGate
from capstan.broker.replication.replica_group import ReplicaGroup
from capstan.broker.store.admission import AdmittedBatch
from capstan.broker.store.async_append import AsyncAppender
from capstan.broker.store.message import Message
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.status import PutResult, PutStatus

Gate = Callable[[], PutResult | None]
"""A last check right before an append: None to go on, or the refusal."""


class WritePath:
    def __init__(
        self,
        broker_name: str,
        store: MessageStore,
        appender: AsyncAppender,
        arrivals: ArrivalNotifier,
        metrics: BrokerMetrics,
        catalog: Catalog,
        replication: ReplicaGroup | None,
        acting_master: ActingMaster | None,
        leadership: LeadershipGate,
        escape: EscapeBridge,
    ) -> None:
        self._broker_name = broker_name
        self._store = store
        self._appender = appender
        self._arrivals = arrivals
        self._metrics = metrics
        self._catalog = catalog
        self._replication = replication
        self._acting_master = acting_master
        self._leadership = leadership
        self._escape = escape

    def _acting(self) -> bool:
        return self._acting_master is not None and self._acting_master.acting

    def admit(
        self, messages: Sequence[Message], max_body: int | None = None
    ) -> AdmittedBatch | PutResult:
        """The batch checked and encoded, or why the store refuses it; `max_body` is a
        body limit below the store's (a client-facing one)."""
        return self._store.admit(messages, max_body)

    async def put(self, messages: Sequence[Message]) -> PutResult:
        batch = self._store.admit(messages)
        if isinstance(batch, PutResult):
            return batch
        return await self.put_admitted(batch)

    async def put_admitted(
        self, batch: AdmittedBatch, still_writable: Gate | None = None
    ) -> PutResult:
        """`still_writable` is asked right before the append (nothing awaits between them),
        for what may change while a write waits (a static topic's queue moving away)."""
        replication = self._replication
        if replication is None:
            refusal = still_writable() if still_writable is not None else None
            result = refusal or await self._appender.append(batch)
        else:
            result = await self._replicated_append(replication, batch, still_writable)
        if not result.status.ok:
            self._metrics.put_failures.labels(result.status.value).inc()
        if result.appended:
            messages = [r.message for r in batch.records]
            topics = {m.topic for m in messages}
            for topic in topics:
                self._arrivals.notify(topic)
            if len(topics) == 1:
                self._metrics.count_in(
                    messages[0].topic, len(messages), sum(len(m.body) for m in messages)
                )
            else:
                for m in messages:
                    self._metrics.count_in(m.topic, 1, len(m.body))
        return result

    def write_refusal(self) -> PutResult | None:
        """Why this broker takes no writes now, or None when it does."""
        r = self._replication
        if r is None or r.is_master:
            return None
        what = "acts for its absent master and" if self._acting() else "is a slave; it"
        return PutResult(
            PutStatus.NOT_MASTER,
            detail=f"broker {r.broker_id} of {self._broker_name} {what} takes no "
            f"writes; its master is {r.master_address or 'unknown'}",
        )

    async def duty_put(self, messages: Sequence[Message]) -> PutResult:
        """Store what a master-only duty produces: here on the master, on another group's
        master when acting for an absent one (escape.py)."""
        r = self._replication
        if r is None or r.is_master or not self._acting():
            return await self.put(messages)
        return await self._escape.put(list(messages))

    async def put_dead_letter(self, messages: list[Message]) -> PutResult:
        for m in messages:
            self._catalog.topic(m.topic)  # creates %DLQ%<group> on first use
        result = await self.duty_put(messages)
        if result.status.ok:
            for m in messages:
                self._metrics.dead_letters.labels(m.topic.removeprefix("%DLQ%")).inc()
        return result

    async def _replicated_append(
        self, replication: ReplicaGroup, batch: AdmittedBatch, still_writable: Gate | None
    ) -> PutResult:
        if self._leadership.closed:
            await self._leadership.passed()  # then refused: this broker no longer leads
        refusal = self.write_refusal()
        if refusal is not None:
            return refusal
        need = await replication.before_write_settled()
        if isinstance(need, AckOutcome):
            return PutResult(
                PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH,
                detail=f"{replication.refusal_detail()}; nothing was stored",
            )
        refusal = still_writable() if still_writable is not None else None
        result = refusal or self._appender.write(batch)
        if not result.status.ok:
            return result
        last = result.appended[-1]
        copies = replication.after_write(last.phys_offset + last.size, need)
        if self._appender.waits_for_flush:  # the fsync and the copies at once, as RocketMQ
            result, outcome = await asyncio.gather(self._appender.until_durable(result), copies)
            if not result.status.ok:
                return result
        else:
            outcome = await copies
        if outcome.ok:
            return result
        if outcome is AckOutcome.IN_SYNC_REPLICAS_NOT_ENOUGH:  # a member stalled meanwhile
            held = replication.held_by_stall(time.monotonic())
            return PutResult(
                PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH,
                result.appended,
                result.store_timestamp_ms,
                f"stored on the master only: {replication.stall_detail(held)}",
            )
        return PutResult(
            PutStatus.FLUSH_SLAVE_TIMEOUT,
            result.appended,
            result.store_timestamp_ms,
            f"stored here, but {need - 1} slave(s) did not acknowledge within "
            f"{replication.settings.slave_ack_timeout_ms} ms",
        )
