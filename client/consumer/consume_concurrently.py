"""ConsumeMessageConcurrentlyService (seed 000): pulled messages, in batches, on a pool.

A pull's messages are cut into batches of `consume_message_batch_max_size` and each batch
goes to a consume thread. The listener answers CONSUME_SUCCESS (with `ack_index` saying how
many of the batch succeeded, all by default) or RECONSUME_LATER (none did); an exception
counts as RECONSUME_LATER. In clustering mode each failed message is sent back to the
broker, which stores a copy in `%RETRY%<group>` for later (or `%DLQ%<group>` once it has
failed `max_reconsume_times` times); a message whose send-back fails stays cached and is
consumed again here after 5 s. In broadcasting mode failed messages are only logged.
Then the batch leaves the ProcessQueue and the queue's offset moves to the smallest offset
still cached: a message is never committed before it has been consumed or sent back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.consume_pool import ConsumePool
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.offset_store import OffsetStore
from capstan.client.consumer.process_queue import ProcessQueue
from capstan.client.consumer.queue_replicas import QueueReplicas
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumerOptions,
    ConsumeStatus,
    Listener,
    MessageModel,
)
from capstan.client.errors import ClientError
from capstan.client.metrics import ConsumerMetrics
from capstan.client.scheduler import Scheduler

log = logging.getLogger(__name__)

LOCAL_RETRY_DELAY_S = 5.0
"""A batch whose send-back failed is consumed again after this long."""


def run_listener(
    listener: Listener, batch: Sequence[ReceivedMessage], context: ConsumeContext
) -> ConsumeStatus:
    """The listener's answer; an exception or a non-status answer counts as a failure."""
    try:
        status: object = listener(batch, context)
    except Exception:
        log.exception("the listener raised on %d messages of %s", len(batch), context.message_queue)
        return ConsumeStatus.RECONSUME_LATER
    if not isinstance(status, ConsumeStatus):
        log.warning("the listener returned %r, not a ConsumeStatus; consuming again later", status)
        return ConsumeStatus.RECONSUME_LATER
    return status


class ConsumeConcurrentlyService:
    def __init__(
        self,
        listener: Listener,
        options: ConsumerOptions,
        calls: BrokerCalls,
        offsets: OffsetStore,
        metrics: ConsumerMetrics,
        scheduler: Scheduler,
        replicas: QueueReplicas,
    ) -> None:
        self._listener = listener
        self._options = options
        self._calls = calls
        self._offsets = offsets
        self._metrics = metrics
        self._scheduler = scheduler
        self._replicas = replicas
        self._pool = ConsumePool(options.consume_thread_count, "capstan-consume")
        self._clustering = options.message_model is MessageModel.CLUSTERING

    def submit(
        self, messages: list[ReceivedMessage], pq: ProcessQueue[ReceivedMessage], mq: MessageQueue
    ) -> None:
        size = self._options.consume_message_batch_max_size
        for start in range(0, len(messages), size):
            self._pool.submit(self._consume, messages[start : start + size], pq, mq)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def _consume(
        self, batch: list[ReceivedMessage], pq: ProcessQueue[ReceivedMessage], mq: MessageQueue
    ) -> None:
        if pq.dropped:
            return
        context = ConsumeContext(message_queue=mq, ack_index=len(batch) - 1)
        started = time.monotonic()
        status = run_listener(self._listener, batch, context)
        self._metrics.consume_latency.observe(time.monotonic() - started)
        if pq.is_dropped():
            # The queue went to another member while we consumed; it consumes from the
            # committed offset, so committing here could skip what it has not seen.
            return
        if status is ConsumeStatus.CONSUME_SUCCESS:
            ack_index = max(-1, min(context.ack_index, len(batch) - 1))
        else:
            ack_index = -1
        failed = batch[ack_index + 1 :]
        if ack_index >= 0:
            self._metrics.consumed.inc(ack_index + 1)
        if failed:
            self._metrics.consume_failures.inc(len(failed))
        keep: list[ReceivedMessage] = []
        if failed and self._clustering:
            keep = [
                m for m in failed if not self._send_back(m, context.delay_level_when_next_consume)
            ]
        elif failed:
            log.warning("broadcasting: %d failed messages of %s are dropped", len(failed), mq)
        done = [m for m in batch if m not in keep] if keep else batch
        offset = pq.remove(done)
        if offset >= 0:
            self._offsets.update_unless_dropped(mq, offset, pq)
        if keep:
            for m in keep:
                m.count_local_retry()
            self._scheduler.call_later(LOCAL_RETRY_DELAY_S, lambda: self._resubmit(keep, pq, mq))

    def _resubmit(
        self, batch: list[ReceivedMessage], pq: ProcessQueue[ReceivedMessage], mq: MessageQueue
    ) -> None:
        self._pool.submit(self._consume, batch, pq, mq)

    def _send_back(self, message: ReceivedMessage, delay_level: int) -> bool:
        limit = self._options.max_reconsume_times

        def send_back(address: str) -> object:
            return self._calls.send_back(address, message.commit_log_offset, delay_level, limit)

        try:
            self._replicas.call(message.message_queue, "send-back", send_back)
        except ClientError as exc:
            log.warning("send-back of %r failed (%s); consuming it again locally", message, exc)
            self._metrics.send_back("no_route" if exc.code == "NO_ROUTE" else "failed")
            return False
        self._metrics.send_back("ok")
        return True
