"""ConsumeMessageOrderlyService (seed 000): each queue consumed by one thread, in order.

Three locks keep a queue's order, across members and rebalances:
1. the broker's queue lock: only the member holding it pulls or consumes the queue (taken
   when the queue is assigned, renewed every 20 s, lapsing on the broker after 60 s, and
   treated as lost here after 30 s without renewal);
2. a local lock per queue: one consume thread at a time runs a queue;
3. the ProcessQueue's consume lock, held while the listener has a batch: a rebalance that
   takes the queue away first `hold`s it (no further batch starts), waits for the running
   batch to commit its offset, and only then persists the offset and unlocks the queue on
   the broker, so the next owner starts exactly after the last consumed message. If the
   queue comes back before that, `unhold` lets it go on where it was.

SUSPEND_CURRENT_QUEUE_A_MOMENT puts the batch back and tries the queue again after
`suspend_current_queue_time_ms`; a message that has failed `max_reconsume_times` times
goes to the dead-letter queue so it cannot block its queue for ever. Only the messages
dead-lettered leave the batch; the others of it are put back and tried again.
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

MAX_TIME_CONSUME_CONTINUOUSLY_S = 60.0
"""One run of a queue yields its thread after this long, so other queues get a turn."""
RELOCK_DELAY_S = 0.1
RELOCK_RETRY_S = 1.0
"""A queue whose lock could not be taken again asks again this soon (the group's current
master, wherever it is now: `queue_replicas.py`)."""
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
        replicas: QueueReplicas,
        lock_queue: Callable[[MessageQueue, ProcessQueue[ReceivedMessage]], bool],
    ) -> None:
        self._listener = listener
        self._options = options
        self._calls = calls
        self._offsets = offsets
        self._metrics = metrics
        self._scheduler = scheduler
        self._replicas = replicas
        self._lock_queue = lock_queue
        self._pool = ConsumePool(options.consume_thread_count, "capstan-consume-orderly")
        self._clustering = options.message_model is MessageModel.CLUSTERING
        self._state_lock = threading.Lock()
        self._local_locks: dict[MessageQueue, threading.Lock] = {}
        self._scheduled: set[MessageQueue] = set()
        self._held: set[ProcessQueue[ReceivedMessage]] = set()  # being let go: no new batch
        self._paused: dict[ProcessQueue[ReceivedMessage], object] = {}  # -> the pause's token

    def submit(
        self, messages: list[ReceivedMessage], pq: ProcessQueue[ReceivedMessage], mq: MessageQueue
    ) -> None:
        self._schedule(pq, mq)

    def _schedule(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        """Run the queue unless a run is already pending or running, or it is paused
        (`_later`) or held."""
        with self._state_lock:
            if mq in self._scheduled or pq in self._paused or pq in self._held:
                return
            self._scheduled.add(mq)
        self._pool.submit(self._run, pq, mq)

    def _later(
        self,
        pq: ProcessQueue[ReceivedMessage],
        mq: MessageQueue,
        delay_s: float,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Pause the queue for `delay_s`: messages pulled meanwhile do not start it either
        (SUSPEND_CURRENT_QUEUE_A_MOMENT means a moment). Then `then`, by default a run."""
        token = object()
        with self._state_lock:
            self._paused[pq] = token

        def resume() -> None:
            with self._state_lock:
                if self._paused.get(pq) is not token:
                    return  # a later pause took this one's place
                del self._paused[pq]
            if then is None:
                self._schedule(pq, mq)
            else:
                then()

        self._scheduler.call_later(delay_s, resume)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def hold(self, pq: ProcessQueue[ReceivedMessage]) -> None:
        """Start no further batch of `pq` (a rebalance is letting its queue go and waits
        for the running batch under `pq.consume_lock`)."""
        with self._state_lock:
            self._held.add(pq)

    def unhold(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        """End a `hold`: the queue stayed this member's (consumption goes on where it
        stopped), or it was let go (then `pq` is dropped and nothing starts)."""
        with self._state_lock:
            if pq not in self._held:
                return
            self._held.discard(pq)
        if not pq.dropped:
            self._schedule(pq, mq)

    def _is_held(self, pq: ProcessQueue[ReceivedMessage]) -> bool:
        with self._state_lock:
            return pq in self._held

    def local_lock(self, mq: MessageQueue) -> threading.Lock:
        with self._state_lock:
            lock = self._local_locks.get(mq)
            if lock is None:
                lock = self._local_locks[mq] = threading.Lock()
            return lock

    def _run(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        idle = False
        try:
            with self.local_lock(mq):
                idle = self._consume_queue(pq, mq)
        except Exception:
            log.exception("orderly consumption of %s failed; trying again", mq)
            self._later(pq, mq, self._options.suspend_current_queue_time_ms / 1000)
        finally:
            with self._state_lock:
                self._scheduled.discard(mq)
        # A pull may have cached messages after the run found none and before it ended.
        if idle and not pq.dropped and pq.count:
            self._schedule(pq, mq)

    def _consume_queue(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> bool:
        """Consume batches while there are any; True when it stopped for want of one
        (every other way out arranges what comes next itself)."""
        started = time.monotonic()
        batch_size = self._options.consume_message_batch_max_size
        while not pq.dropped:
            if self._clustering and (not pq.locked or pq.lock_expired()):
                self._later(pq, mq, RELOCK_DELAY_S, lambda: self._relock(pq, mq))
                return False
            if time.monotonic() - started > MAX_TIME_CONSUME_CONTINUOUSLY_S:
                self._later(pq, mq, 0.01)
                return False
            with pq.consume_lock:
                if pq.is_dropped() or self._is_held(pq):
                    return False
                batch = pq.take(batch_size)
                if not batch:
                    return True
                suspend_ms = self._consume_batch(pq, mq, batch)
            if suspend_ms is not None:
                self._later(pq, mq, suspend_ms / 1000)
                return False
        return False

    def _consume_batch(
        self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue, batch: list[ReceivedMessage]
    ) -> int | None:
        """Run the listener on a taken batch and settle it (the caller holds the consume
        lock); None when the queue goes on, else how many ms it pauses."""
        context = ConsumeContext(message_queue=mq, ack_index=len(batch) - 1)
        began = time.monotonic()
        status = run_listener(self._listener, batch, context)
        self._metrics.consume_latency.observe(time.monotonic() - began)
        if status is ConsumeStatus.CONSUME_SUCCESS:
            self._metrics.consumed.inc(len(batch))
            self._commit(pq, mq, [])
            return None
        self._metrics.consume_failures.inc(len(batch))
        dead = {m.queue_offset for m in self._give_up(batch)}
        again = [m for m in batch if m.queue_offset not in dead]
        for m in again:
            m.count_local_retry()
        pq.put_back(again)
        if dead:
            self._commit(pq, mq, again)  # the dead-lettered part is done with
        if not again:
            return None
        if context.suspend_ms >= 0:
            return context.suspend_ms
        return self._options.suspend_current_queue_time_ms

    def _commit(
        self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue, again: list[ReceivedMessage]
    ) -> None:
        """Commit what was taken and not put back, but never past a message put back."""
        offset = pq.commit()
        if again:
            offset = min(offset, *(m.queue_offset for m in again))
        if offset >= 0:
            # Not once the queue was dropped (an offset reset forgot it; a commit here
            # would bring the old offset back). A rebalance taking the queue away holds
            # it instead and waits for this commit before it persists and unlocks.
            self._offsets.update_unless_dropped(mq, offset, pq)

    def _give_up(self, batch: list[ReceivedMessage]) -> list[ReceivedMessage]:
        """Dead-letter each message of the batch that has failed too often; the ones that
        went (one whose send-back fails stays, to be tried again)."""
        limit = self._options.max_reconsume_times
        if not self._clustering:
            return []
        dead = []
        for m in batch:
            if m.reconsume_times < limit:
                continue

            def dead_letter(address: str, m: ReceivedMessage = m) -> object:
                return self._calls.send_back(address, m.commit_log_offset, DEAD_LETTER_LEVEL, limit)

            try:
                self._replicas.call(m.message_queue, "dead-letter send-back", dead_letter)
            except ClientError as exc:
                log.warning("could not dead-letter %r (%s); suspending its queue", m, exc)
                self._metrics.send_back("failed")
                continue
            self._metrics.send_back("dead_letter")
            dead.append(m)
        return dead

    def _relock(self, pq: ProcessQueue[ReceivedMessage], mq: MessageQueue) -> None:
        if pq.dropped:
            return
        if self._lock_queue(mq, pq):
            self._schedule(pq, mq)
        else:
            self._later(pq, mq, RELOCK_RETRY_S, lambda: self._relock(pq, mq))
