"""ConsumeMessageOrderlyService (seed 000): each queue consumed by one thread, in order.

Three locks keep a queue's order, across members and rebalances:
1. the broker's queue lock: only the member holding it pulls or consumes the queue (taken
   when the queue is assigned, renewed every 20 s, lapsing on the broker after 60 s, and
   treated as lost here after 30 s without renewal);
2. a local lock per queue: one consume thread at a time runs a queue;
3. the ProcessQueue's consume lock, held while the listener has a batch: a rebalance that
   takes the queue away waits for it before it commits the offset and unlocks the queue
   on the broker, so the next owner starts exactly after the last consumed message.

SUSPEND_CURRENT_QUEUE_A_MOMENT puts the batch back and tries the queue again after
`suspend_current_queue_time_ms`; a message that has failed `max_reconsume_times` times
goes to the dead-letter queue so it cannot block its queue for ever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.consume_concurrently import run_listener
from capstan.client.consumer.consume_pool import ConsumePool
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.offset_store import OffsetStore
from capstan.client.consumer.process_queue import ProcessQueue
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

MAX_TIME_CONSUME_CONTINUOUSLY_S = 60.0
"""One run of a queue yields its thread after this long, so other queues get a turn."""
RELOCK_DELAY_S = 0.1
DEAD_LETTER_LEVEL = -1


class ConsumeOrderlyService:
    def __init__(
        self,
        listener: Listener,
        options: ConsumerOptions,
        calls: BrokerCalls,
        offsets: OffsetStore,
        metrics: ConsumerMetrics,
        scheduler: Scheduler,
        address_of: Callable[[MessageQueue], str | None],
        lock_queue: Callable[[MessageQueue, ProcessQueue[ReceivedMessage]], bool],
    ) -> None:
        self._listener = listener
        self._options = options
        self._calls = calls
        self._offsets = offsets
        self._metrics = metrics
        self._scheduler = scheduler
        self._address_of = address_of
        self._lock_queue = lock_queue
        self._pool = ConsumePool(options.consume_thread_count, "capstan-consume-orderly")
        self._clustering = options.message_model is MessageModel.CLUSTERING
        self._state_lock = threading.Lock()
        self._local_locks: dict[MessageQueue, threading.Lock] = {}
        self._scheduled: set[MessageQueue] = set()

    def submit(
        self, messages: list[ReceivedMessage], pq: ProcessQueue[ReceivedMessage], mq: MessageQueue
    ) -> None:
        self._schedule(pq, mq)

    def _schedule(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        """Run the queue unless a run is already pending or running."""
        with self._state_lock:
            if mq in self._scheduled:
                return
            self._scheduled.add(mq)
        self._pool.submit(self._run, pq, mq)

    def _later(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue, delay_s: float) -> None:
        self._scheduler.call_later(delay_s, lambda: self._schedule(pq, mq))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def local_lock(self, mq: MessageQueue) -> threading.Lock:
        with self._state_lock:
            lock = self._local_locks.get(mq)
            if lock is None:
                lock = self._local_locks[mq] = threading.Lock()
            return lock

    def _run(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        try:
            with self.local_lock(mq):
                self._consume_queue(pq, mq)
        except Exception:
            log.exception("orderly consumption of %s failed; trying again", mq)
            self._later(pq, mq, self._options.suspend_current_queue_time_ms / 1000)
        finally:
            with self._state_lock:
                self._scheduled.discard(mq)
        # A pull may have cached messages after the run found none and before it ended.
        if not pq.dropped and pq.count and mq not in self._scheduled:
            self._schedule(pq, mq)

    def _consume_queue(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        started = time.monotonic()
        batch_size = self._options.consume_message_batch_max_size
        while not pq.dropped:
            if self._clustering and (not pq.locked or pq.lock_expired()):
                self._scheduler.call_later(RELOCK_DELAY_S, lambda: self._relock(pq, mq))
                return
            if time.monotonic() - started > MAX_TIME_CONSUME_CONTINUOUSLY_S:
                self._later(pq, mq, 0.01)
                return
            with pq.consume_lock:
                if pq.is_dropped():
                    return
                batch = pq.take(batch_size)
                if not batch:
                    return
                context = ConsumeContext(message_queue=mq, ack_index=len(batch) - 1)
                began = time.monotonic()
                status = run_listener(self._listener, batch, context)
                self._metrics.consume_latency.observe(time.monotonic() - began)
                if status is ConsumeStatus.RECONSUME_LATER:
                    status = ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
                if status is ConsumeStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT and self._give_up(batch):
                    status = ConsumeStatus.CONSUME_SUCCESS  # all went to the dead-letter queue
                if status is ConsumeStatus.CONSUME_SUCCESS:
                    self._metrics.consumed.inc(len(batch))
                    offset = pq.commit()
                    if offset >= 0 and not pq.dropped:
                        self._offsets.update(mq, offset, increase_only=False)
                    continue
                self._metrics.consume_failures.inc(len(batch))
                for m in batch:
                    m.count_local_retry()
                pq.put_back(batch)
            suspend_ms = context.suspend_ms
            if suspend_ms < 0:
                suspend_ms = self._options.suspend_current_queue_time_ms
            self._later(pq, mq, suspend_ms / 1000)
            return

    def _give_up(self, batch: list[ReceivedMessage]) -> bool:
        """Dead-letter the batch if a message of it has failed too often; whether it did
        (if a send-back fails the batch is suspended and tried again instead)."""
        limit = self._options.max_reconsume_times
        if not self._clustering or all(m.reconsume_times < limit for m in batch):
            return False
        for m in batch:
            if m.reconsume_times < limit:
                continue
            address = self._address_of(m.message_queue)
            try:
                if address is None:
                    raise ClientError(f"no broker serves {m.message_queue}", "NO_ROUTE")
                self._calls.send_back(address, m.commit_log_offset, DEAD_LETTER_LEVEL, limit)
                self._metrics.send_back("dead_letter")
            except ClientError as exc:
                log.warning("could not dead-letter %r (%s); suspending its queue", m, exc)
                return False
        return all(m.reconsume_times >= limit for m in batch)

    def _relock(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        if pq.dropped:
            return
        if self._lock_queue(mq, pq):
            self._schedule(pq, mq)
        else:
            self._later(pq, mq, 3.0)
