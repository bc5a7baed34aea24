"""LitePullService: the LitePullConsumer's queues, its pull loop and the buffer poll takes from.

One thread keeps a long-polling capstan.v1 Pull under way for every held queue that is not
paused and whose buffered messages are below `pull_threshold_for_queue` (and
`pull_threshold_size_for_queue_mib`). Answers wait as batches, in arrival order, until
`take()` hands them out: up to a limit, in order within each queue, the batches of a
paused queue left where they are (Kafka's pause: nothing of the queue comes out).

Each held queue has a ProcessQueue for its share of the buffer. A seek or a release drops
it, which makes the pull under way (cancelled) and the buffered batches stale; a new one
takes its place on a seek. Each pull asks which replica of the queue's group to call
(`queue_replicas.py`): a pull the replica could not serve moves the group on to its next
replica, and the queue is pulled again there at once.

`consumed` of a queue is one past the last message `take()` handed out (the commit point of
its ProcessQueue), or where a seek put it; NO_NEW_MSG / NO_MATCHED_MSG / OFFSET_ILLEGAL move
it to `next_begin_offset` when nothing of the queue is buffered, since nothing in between is
for this consumer.
"""

from __future__ import annotations

import logging
import queue as queues_
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc

from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.process_queue import ProcessQueue
from capstan.client.consumer.pull_service import (
    AFTER_ERROR_DELAY_S,
    HELD_PULL_S,
    MOVED_QUEUE_PULL_S,
    SAME_REPLICA_RETRY_S,
)
from capstan.client.consumer.queue_replicas import QueueReplicas, moves_on
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import ConsumerOptions
from capstan.client.errors import ClientError, from_exception
from capstan.client.metrics import ConsumerMetrics
from capstan.v1 import pull_pb2 as p

log = logging.getLogger(__name__)

LOOP_IDLE_S = 0.1
"""How long the pull loop waits for an answer before it looks again at the queues it could
not pull (over a threshold, or put off after a failure). A take, resume, seek or new queue
wakes it at once."""


@dataclass(eq=False)
class HeldQueue:
    """A queue the consumer holds: where the next pull starts, how far take() has got."""

    queue: MessageQueue
    expression: str
    next_offset: int
    consumed: int
    pq: ProcessQueue[ReceivedMessage] = field(default_factory=ProcessQueue)
    address: str = ""
    """The replica the last pull went to (each pull asks `queue_replicas.py` afresh)."""
    paused: bool = False
    pulling: Any = None
    """The pull under way (a grpc future), or None."""
    not_before: float = 0.0
    """Monotonic time before which no pull starts (set after a failed one)."""


@dataclass(eq=False)
class _Batch:
    """Messages of one pull answer (or what take() left of them)."""

    held: HeldQueue
    pq: ProcessQueue[ReceivedMessage]
    messages: list[ReceivedMessage]


_Answer = tuple[HeldQueue, ProcessQueue[ReceivedMessage], Any] | None
"""(queue, its ProcessQueue when the pull started, the finished grpc future), or None to
wake the loop."""


class LitePullService:
    def __init__(
        self,
        calls: BrokerCalls,
        replicas: QueueReplicas,
        options: ConsumerOptions,
        metrics: ConsumerMetrics,
    ) -> None:
        self._calls = calls
        self._replicas = replicas
        self._options = options
        self._metrics = metrics
        self._max_bytes = options.pull_threshold_size_for_queue_mib * 1024 * 1024
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._held: dict[MessageQueue, HeldQueue] = {}
        self._buffer: deque[_Batch] = deque()
        self._answers: queues_.SimpleQueue[_Answer] = queues_.SimpleQueue()
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._pull_routine, name="capstan-lite-pull", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """End the loop, cancel the pulls under way; `consumed` stays readable."""
        self._stopped.set()
        self._answers.put(None)
        with self._arrived:
            self._arrived.notify_all()  # a take() waiting returns []
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            for held in self._held.values():
                self._drop_locked(held)

    # -- the table of held queues ----------------------------------------------------------

    def add(self, queue: MessageQueue, expression: str, offset: int) -> None:
        with self._lock:
            self._held[queue] = HeldQueue(queue, expression, offset, offset)
        self._answers.put(None)

    def remove(self, queue: MessageQueue) -> HeldQueue | None:
        """Let go of the queue (its buffered messages are dropped); what it was, if held."""
        with self._lock:
            held = self._held.pop(queue, None)
            if held is not None:
                self._drop_locked(held)
        return held

    def queues(self) -> list[MessageQueue]:
        with self._lock:
            return sorted(self._held)

    def consumed(self) -> dict[MessageQueue, int]:
        with self._lock:
            return {q: held.consumed for q, held in self._held.items()}

    def reposition(self, queue: MessageQueue, offset: int) -> None:
        """Drop what is buffered of the queue and pull (and count consumed) from `offset`."""
        with self._lock:
            held = self._held.get(queue)
            if held is None:
                raise ValueError(f"{queue} is not assigned to this consumer")
            self._drop_locked(held)
            held.pq = ProcessQueue()
            held.next_offset = held.consumed = offset
            held.not_before = 0.0
        self._answers.put(None)

    def set_paused(self, queues: Iterable[MessageQueue], paused: bool) -> None:
        """Pause or resume; queues not held are ignored."""
        with self._arrived:
            for queue in queues:
                held = self._held.get(queue)
                if held is not None:
                    held.paused = paused
            self._arrived.notify_all()  # resumed queues' buffered batches may be taken
        self._answers.put(None)

    def _drop_locked(self, held: HeldQueue) -> None:
        held.pq.dropped = True
        if held.pulling is not None:
            held.pulling.cancel()
            held.pulling = None
        self._buffer = deque(b for b in self._buffer if b.held is not held)

    # -- the buffer ----------------------------------------------------------------------

    def take(self, limit: int, timeout_s: float) -> list[ReceivedMessage]:
        """Up to `limit` buffered messages, waiting up to `timeout_s` for the first."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            taken = self._take_locked(limit)
            while not taken and not self._stopped.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._arrived.wait(left)
                taken = self._take_locked(limit)
        if taken:
            self._answers.put(None)  # room in the buffer: the loop may pull those queues again
        return taken

    def _take_locked(self, limit: int) -> list[ReceivedMessage]:
        taken: list[ReceivedMessage] = []
        paused: list[_Batch] = []
        while self._buffer and len(taken) < limit:
            batch = self._buffer.popleft()
            if batch.pq.dropped:
                continue
            if batch.held.paused:
                paused.append(batch)
                continue
            room = limit - len(taken)
            if len(batch.messages) > room:
                self._buffer.appendleft(_Batch(batch.held, batch.pq, batch.messages[room:]))
                batch = _Batch(batch.held, batch.pq, batch.messages[:room])
            taken.extend(batch.messages)
            offset = batch.pq.remove(batch.messages)
            batch.held.consumed = max(batch.held.consumed, offset)
        self._buffer.extendleft(reversed(paused))  # each queue's batches keep their order
        return taken

    # -- the loop ------------------------------------------------------------------------

    def _pull_routine(self) -> None:
        while not self._stopped.is_set():
            try:
                self._start_pulls()
                try:
                    answer = self._answers.get(timeout=LOOP_IDLE_S)
                except queues_.Empty:
                    continue
                if answer is not None:
                    self._on_answer(*answer)
            except Exception:
                log.exception("the pull loop failed a round; going on")
                time.sleep(LOOP_IDLE_S)

    def _start_pulls(self) -> None:
        now = time.monotonic()
        with self._lock:
            for held in self._held.values():
                if self._may_pull_locked(held, now):
                    self._pull_locked(held)

    def _may_pull_locked(self, held: HeldQueue, now: float) -> bool:
        pq = held.pq
        if held.pulling is not None or held.paused or held.not_before > now or pq.dropped:
            return False
        if pq.count >= self._options.pull_threshold_for_queue:
            self._metrics.flow_control_hit("count")
            return False
        if pq.size_bytes >= self._max_bytes:
            self._metrics.flow_control_hit("size")
            return False
        return True

    def _pull_locked(self, held: HeldQueue) -> None:
        pq = held.pq
        pq.last_pull_at = time.monotonic()
        address = self._replicas.address(held.queue)
        if address is None:
            log.warning("no route names the group of %s; pulling it again later", held.queue)
            self._replicas.ask_route(held.queue)
            held.not_before = time.monotonic() + AFTER_ERROR_DELAY_S
            return
        held.address = address
        future = self._calls.pull_future(
            address,
            held.queue,
            held.next_offset,
            self._options.pull_batch_size,
            held.expression,
            self._options.long_polling_ms,
        )
        held.pulling = future
        future.add_done_callback(lambda done: self._answers.put((held, pq, done)))

    def _on_answer(self, held: HeldQueue, pq: ProcessQueue[ReceivedMessage], done: Any) -> None:
        with self._lock:
            if held.pq is not pq or pq.dropped:
                return  # sought or let go since the pull started
            held.pulling = None
        self._metrics.pull_latency.observe(time.monotonic() - pq.last_pull_at)
        try:
            response: p.PullMessagesResponse = done.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as exc:
            if not self._stopped.is_set():
                self._after_failure(held, from_exception(exc, f"pull at {held.address}"))
            return
        with self._arrived:
            if held.pq is pq and not pq.dropped:
                self._take_answer_locked(held, response)

    def _after_failure(self, held: HeldQueue, error: ClientError) -> None:
        """As the push consumer's pulls: another replica of the group at once when this
        one could not serve, else a little later."""
        log.warning("pull of %s failed: %s", held.queue, error)
        if not moves_on(error):
            held.not_before = time.monotonic() + AFTER_ERROR_DELAY_S
            return
        self._replicas.failed(held.queue, held.address)
        if self._replicas.address(held.queue) in (None, held.address):
            held.not_before = time.monotonic() + SAME_REPLICA_RETRY_S

    def _take_answer_locked(self, held: HeldQueue, response: p.PullMessagesResponse) -> None:
        status = response.status
        if status == p.FOUND:
            messages = [ReceivedMessage(m, held.queue) for m in response.messages]
            held.pq.put(messages)
            held.next_offset = response.next_begin_offset
            self._buffer.append(_Batch(held, held.pq, messages))
            self._metrics.pulled_messages.inc(len(messages))
            self._arrived.notify_all()
        elif status in (p.NO_NEW_MSG, p.NO_MATCHED_MSG, p.OFFSET_ILLEGAL):
            if status == p.OFFSET_ILLEGAL:
                log.warning(
                    "offset %d of %s is illegal (queue holds %d..%d); moving to %d",
                    held.next_offset,
                    held.queue,
                    response.min_offset,
                    response.max_offset,
                    response.next_begin_offset,
                )
            held.next_offset = response.next_begin_offset
            if held.pq.count == 0:
                held.consumed = response.next_begin_offset
            if response.continues_on:  # a static queue moved away: read on at its leader
                self._replicas.ask_route(held.queue)
                held.not_before = time.monotonic() + MOVED_QUEUE_PULL_S
            elif response.commit_wanted:  # held until what came before is committed
                held.not_before = time.monotonic() + HELD_PULL_S
        else:
            log.warning("pull of %s answered status %s", held.queue, status)
            held.not_before = time.monotonic() + AFTER_ERROR_DELAY_S
