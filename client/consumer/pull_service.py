"""PullMessageService (seeds 000 and 004): one thread pulls every owned queue in turn.

A PullRequest per owned queue circulates: the thread takes one from its queue, checks flow
control, and starts a long-polling pull; the answer comes back through the same queue and
the request is put back for its next pull. Flow control puts a request off 50 ms when its
ProcessQueue caches more than `pull_threshold_for_queue` messages, more than
`pull_threshold_size_for_queue_mib`, or (concurrent) spans more than
`consume_concurrently_max_span` offsets; each hit is counted.

Answers, as seed 004 handles them:
- FOUND: cache the messages, hand them to the consume service, pull again from
  `next_begin_offset`.
- NO_NEW_MSG / NO_MATCHED_MSG: pull again from `next_begin_offset`; when nothing is cached
  the offset may move there at once (nothing in between is for us).
- OFFSET_ILLEGAL: the queue is dropped; after a pause its offset is corrected to
  `next_begin_offset` and written down, and the next rebalance takes it up again (unless
  a rebalance took it up afresh during the pause: that newer request decides).
- a call the replica could not serve (unreachable, no answer in time, not able to act
  now): the queue's group moves on to its next replica (`queue_replicas.py`) and the queue
  is pulled again at once there, or after `SAME_REPLICA_RETRY_S` when the group has no
  other; every pull asks which replica to call, so none stays bound to one that failed.
- any other failure: pull again after 3 s.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.offset_store import OffsetStore
from capstan.client.consumer.process_queue import ProcessQueue
from capstan.client.consumer.queue_replicas import QueueReplicas, moves_on
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import ConsumerOptions, MessageModel
from capstan.client.errors import ClientError, from_exception
from capstan.client.metrics import ConsumerMetrics
from capstan.client.scheduler import Scheduler
from capstan.v1 import pull_pb2 as p

log = logging.getLogger(__name__)

MIB = 1024 * 1024
FLOW_CONTROL_DELAY_S = 0.05
"""A flow-controlled queue's next pull waits this long, in seconds (RocketMQ: 50 ms)."""
AFTER_ERROR_DELAY_S = 3.0
MOVED_QUEUE_PULL_S = 2.0
"""Pause before pulling again a static topic's logic queue this group read to the end of
(it moved to another group, which the refreshed route names); it may move back."""
HELD_PULL_S = 0.3
"""Pause before pulling again an ordered read the broker holds until the offset it reached
is committed (a static topic's logic queue past an older item: `commit_wanted`)."""
SAME_REPLICA_RETRY_S = 0.5
"""A pull that failed at the only replica its group names is tried again this soon (the
channel reconnects every 0.5 s; a master being elected takes about as long)."""
NOT_LOCKED_DELAY_S = 0.5
"""Orderly: a queue whose broker lock this client does not hold looks again this soon (a
local check; the lock is taken, or retried within a second, by the consumer)."""
OFFSET_ILLEGAL_DROP_DELAY_S = 10.0


def flow_control_reason(
    count: int, size_bytes: int, span: int, options: ConsumerOptions, orderly: bool
) -> str | None:
    """Why a queue with this much cached may not be pulled now, or None when it may.

    Seed 000 trips each limit only when it is exceeded: exactly 1000 messages, 100 MiB or
    a span of 2000 (the defaults) still pull. Orderly consumption skips the span check, as
    RocketMQ does: it consumes in offset order, so no early message can hold the commit
    point back while later ones are consumed.
    """
    if count > options.pull_threshold_for_queue:
        return "count"
    if size_bytes > options.pull_threshold_size_for_queue_mib * MIB:
        return "size"
    if not orderly and span > options.consume_concurrently_max_span:
        return "span"
    return None


@dataclass(eq=False)
class PullRequest:
    queue: MessageQueue
    process_queue: ProcessQueue[ReceivedMessage]
    next_offset: int
    expression: str
    address: str = ""
    """The replica the pull under way went to."""
    started: float = field(default=0.0)


Deliver = Callable[[PullRequest, list[ReceivedMessage], int], None]
"""(request, new messages, how many were new) → hand them to the consume service."""


class PullMessageService:
    def __init__(
        self,
        calls: BrokerCalls,
        replicas: QueueReplicas,
        options: ConsumerOptions,
        offsets: OffsetStore,
        metrics: ConsumerMetrics,
        scheduler: Scheduler,
        deliver: Deliver,
        drop_queue: Callable[[MessageQueue, ProcessQueue[ReceivedMessage]], None],
        orderly: bool,
    ) -> None:
        self._calls = calls
        self._replicas = replicas
        self._options = options
        self._offsets = offsets
        self._metrics = metrics
        self._scheduler = scheduler
        self._deliver = deliver
        self._drop_queue = drop_queue
        self._orderly = orderly
        self._work: queue.SimpleQueue[tuple[PullRequest, Any]] = queue.SimpleQueue()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capstan-pull", daemon=True)
        # The newest request of each queue: a queue let go and taken up again gets a new
        # one, and a correction still pending for the old one must leave it alone.
        self._live: dict[MessageQueue, PullRequest] = {}
        self._live_lock = threading.Lock()
        self._clustering = options.message_model is MessageModel.CLUSTERING

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._work.put((None, None))  # type: ignore[arg-type]
        if self._thread.is_alive():
            self._thread.join(5)

    def pull_now(self, request: PullRequest) -> None:
        if self._live.get(request.queue) is not request and not request.process_queue.dropped:
            with self._live_lock:
                self._live[request.queue] = request
        self._work.put((request, None))

    def pull_later(self, request: PullRequest, delay_s: float) -> None:
        if not self._stopped.is_set():
            self._scheduler.call_later(delay_s, lambda: self.pull_now(request))

    # -- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped.is_set():
            request, answer = self._work.get()
            if request is None or self._stopped.is_set():
                return
            try:
                if answer is None:
                    self._pull(request)
                else:
                    self._on_answer(request, answer)
            except Exception:
                log.exception("pulling %s failed; trying again later", request.queue)
                self.pull_later(request, AFTER_ERROR_DELAY_S)

    def _pull(self, request: PullRequest) -> None:
        pq = request.process_queue
        if pq.dropped:
            return
        pq.last_pull_at = time.monotonic()
        reason = flow_control_reason(pq.count, pq.size_bytes, pq.span, self._options, self._orderly)
        if reason is not None:
            self._metrics.flow_control_hit(reason)
            self.pull_later(request, FLOW_CONTROL_DELAY_S)
            return
        if self._orderly and self._clustering and not pq.locked:
            self.pull_later(request, NOT_LOCKED_DELAY_S)
            return
        address = self._replicas.address(request.queue)
        if address is None:
            log.warning("no route names the group of %s; pulling it again later", request.queue)
            self._replicas.ask_route(request.queue)
            self.pull_later(request, AFTER_ERROR_DELAY_S)
            return
        request.address = address
        request.started = time.monotonic()
        future = self._calls.pull_future(
            address,
            request.queue,
            request.next_offset,
            self._options.pull_batch_size,
            request.expression,
            self._options.long_polling_ms,
        )
        future.add_done_callback(lambda done: self._work.put((request, done)))

    def _on_answer(self, request: PullRequest, done: Any) -> None:
        pq = request.process_queue
        self._metrics.pull_latency.observe(time.monotonic() - request.started)
        try:
            response: p.PullMessagesResponse = done.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as exc:
            if not self._stopped.is_set() and not pq.dropped:
                self._after_failure(request, from_exception(exc, f"pull at {request.address}"))
            return
        if pq.dropped:
            return
        status = response.status
        if status == p.FOUND:
            request.next_offset = response.next_begin_offset
            mq = request.queue
            messages = [ReceivedMessage(m, mq) for m in response.messages]
            added = pq.put(messages)
            self._metrics.pulled_messages.inc(len(messages))
            self._deliver(request, messages, added)
            self.pull_now(request)
        elif status in (p.NO_NEW_MSG, p.NO_MATCHED_MSG):
            request.next_offset = response.next_begin_offset
            if pq.count == 0:
                self._offsets.update(request.queue, request.next_offset)
            if response.continues_on:  # a static queue moved away: read on at its leader
                if pq.count == 0 and self._clustering:
                    self._commit_now(request.queue)
                self._replicas.ask_route(request.queue)
                self.pull_later(request, MOVED_QUEUE_PULL_S)
            elif response.commit_wanted:  # held until what came before is committed
                if pq.count == 0 and self._clustering:
                    self._commit_now(request.queue)
                self.pull_later(request, HELD_PULL_S)
            else:
                self.pull_now(request)
        elif status == p.OFFSET_ILLEGAL:
            log.warning(
                "offset %d of %s is illegal (queue holds %d..%d); moving to %d",
                request.next_offset,
                request.queue,
                response.min_offset,
                response.max_offset,
                response.next_begin_offset,
            )
            request.next_offset = response.next_begin_offset
            pq.dropped = True
            self._scheduler.call_later(OFFSET_ILLEGAL_DROP_DELAY_S, lambda: self._correct(request))
        else:
            log.warning("pull of %s answered status %s", request.queue, status)
            self.pull_later(request, AFTER_ERROR_DELAY_S)

    def _commit_now(self, queue: MessageQueue) -> None:
        """Commit the offset of a queue consumed to the end of what its group holds (a
        static queue that moved away), not at the next persist: an ordered read of the
        queue's next item at its new group waits for this offset to reach that end."""
        self._scheduler.call_later(0, lambda: self._offsets.persist([queue]))

    def _after_failure(self, request: PullRequest, error: ClientError) -> None:
        """A pull failed: another replica of the group takes it at once when this one
        could not serve; else it is tried again a little later."""
        log.warning("pull of %s failed: %s", request.queue, error)
        if not moves_on(error):
            self.pull_later(request, AFTER_ERROR_DELAY_S)
            return
        self._replicas.failed(request.queue, request.address)
        if self._replicas.address(request.queue) not in (None, request.address):
            self.pull_now(request)
        else:
            self.pull_later(request, SAME_REPLICA_RETRY_S)

    def _correct(self, request: PullRequest) -> None:
        with self._live_lock:
            current = self._live.get(request.queue) is request
        if not current:
            # Let go and taken up again meanwhile: the new request has its own offset, and
            # dropping the queue now would orphan its ProcessQueue, still pulling, while
            # the rebalance took the queue up a second time.
            log.info("%s was taken up again; its old offset correction is void", request.queue)
            return
        self._offsets.update(request.queue, request.next_offset, increase_only=False)
        self._offsets.persist([request.queue])
        self._drop_queue(request.queue, request.process_queue)
