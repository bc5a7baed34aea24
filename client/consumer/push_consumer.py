"""PushConsumer: RocketMQ's push consumer, a pull loop driven by client-side rebalance.

    consumer = PushConsumer(["127.0.0.1:8081"], "my-group", listener)
    consumer.subscribe("orders", "paid||shipped")
    consumer.start()
    ...
    consumer.shutdown()

Its parts, one module each: GroupSession (heartbeats, member-change news), RebalanceImpl
(which queues are ours), PullMessageService (flow-controlled long-polling pulls), the
consume services (concurrent or orderly) and the offset store. This class wires them and
owns each queue's ProcessQueue from the moment the rebalance adds it until it removes it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from capstan.client.channels import ChannelPool, new_client_id
from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.consume_concurrently import ConsumeConcurrentlyService
from capstan.client.consumer.consume_orderly import ConsumeOrderlyService
from capstan.client.consumer.group_session import GroupSession
from capstan.client.consumer.message_queue import MessageQueue, retry_topic
from capstan.client.consumer.offset_store import (
    LocalFileOffsetStore,
    OffsetStore,
    RemoteOffsetStore,
    start_offset,
)
from capstan.client.consumer.process_queue import ProcessQueue, lock_lease_s
from capstan.client.consumer.pull_service import PullMessageService, PullRequest
from capstan.client.consumer.queue_replicas import QueueReplicas
from capstan.client.consumer.rebalance import RebalanceImpl, RebalanceService
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumerOptions,
    Listener,
    MessageModel,
)
from capstan.client.errors import ClientError
from capstan.client.metrics import ConsumerMetrics
from capstan.client.route import RouteCache
from capstan.client.scheduler import Scheduler
from capstan.security.signature import Credentials
from capstan.v1 import consumer_pb2 as c

log = logging.getLogger(__name__)

REMOVE_WAIT_S = 1.0
"""Orderly: how long a rebalance waits for a running batch before it tries again later."""
RENEW_RETRY_S = 1.0
"""Orderly: locks whose renewal failed at every replica of their group are renewed again
this soon."""
RETRY_REBALANCE_S = 1.0
"""Orderly: a queue whose broker lock was still held elsewhere, or that could not be let go
yet (a batch still running), is tried again this soon."""


class PushConsumer:
    def __init__(
        self,
        endpoints: list[str] | str,
        group: str,
        listener: Listener,
        *,
        orderly: bool = False,
        options: ConsumerOptions | None = None,
        client_id: str | None = None,
        credentials: Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.group = group
        self.options = options or ConsumerOptions()
        self.orderly = orderly
        self.client_id = client_id or new_client_id()
        self._clustering = self.options.message_model is MessageModel.CLUSTERING
        endpoint_list = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self._channels = ChannelPool(credentials, ca_file)
        self._route = RouteCache(
            endpoint_list, self._channels, self.client_id, self.options.route_refresh_s
        )
        self._calls = BrokerCalls(self._channels, self.client_id, group)
        self._replicas = QueueReplicas(self._route)
        self.metrics = ConsumerMetrics(group, self.client_id)
        self._scheduler = Scheduler(f"capstan-consumer-{group}")
        self._table: dict[MessageQueue, ProcessQueue[ReceivedMessage]] = {}
        self._table_lock = threading.Lock()
        self._rebalance = RebalanceImpl(
            self.client_id,
            self.options,
            self._route,
            self._calls,
            self._replicas,
            self._add_queue,
            self._remove_queue,
            self._keep_queue,
        )
        self.offsets: OffsetStore
        if self._clustering:
            self.offsets = RemoteOffsetStore(self._calls, self._replicas)
        else:
            path = (
                self.options.offset_file or Path.home() / ".capstan" / "offsets" / f"{group}.json"
            )
            self.offsets = LocalFileOffsetStore(path)
        self._consume: ConsumeConcurrentlyService | ConsumeOrderlyService
        if orderly:
            self._consume = ConsumeOrderlyService(
                listener,
                self.options,
                self._calls,
                self.offsets,
                self.metrics,
                self._scheduler,
                self._replicas,
                self._lock_one,
            )
        else:
            self._consume = ConsumeConcurrentlyService(
                listener,
                self.options,
                self._calls,
                self.offsets,
                self.metrics,
                self._scheduler,
                self._replicas,
            )
        self._pull = PullMessageService(
            self._calls,
            self._replicas,
            self.options,
            self.offsets,
            self.metrics,
            self._scheduler,
            self._deliver,
            self._dropped_by_pull,
            orderly,
        )
        self._session = GroupSession(
            self._calls,
            c.CLUSTERING if self._clustering else c.BROADCASTING,
            c.PUSH,
            orderly,
            lambda: dict(self._rebalance.subscriptions),
            lambda: list(self._rebalance.owned()),
            self._rebalance.addresses,
            self.request_rebalance,
            self.options.heartbeat_interval_s,
            self._apply_reset,
        )
        self._stopped = threading.Event()
        self._rebalancer = RebalanceService(
            self._rebalance,
            self.options.rebalance_interval_s,
            self.metrics,
            self._session.heartbeat_all,  # tell the others what we own now
        )
        self._route.watch(lambda topic: self._rebalancer.request())  # queues came or went
        self._started = False

    # -- the user's side ---------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        if self._started:
            raise RuntimeError("subscribe before start()")
        self._rebalance.subscriptions[topic] = expression.strip() or "*"

    def start(self) -> PushConsumer:
        if not self._rebalance.subscriptions:
            raise RuntimeError("subscribe to at least one topic before start()")
        if self._clustering:
            self._rebalance.subscriptions.setdefault(retry_topic(self.group), "*")
        for topic in self._rebalance.subscriptions:
            self._route.queues(topic)  # an unknown topic fails here, clearly
        self._started = True
        self._route.start()
        self._pull.start()
        self._session.start()
        self._scheduler.every(self.options.persist_offset_interval_s, self._persist_offsets)
        if self.orderly and self._clustering:
            self._scheduler.every(self.options.lock_renew_interval_s, self._lock_all)
        self._rebalancer.start()
        return self

    def shutdown(self) -> None:
        """Stop pulling, let running batches finish, commit offsets, release locks, leave."""
        if not self._started or self._stopped.is_set():
            return
        self._stopped.set()
        self._rebalancer.stop()
        self._pull.stop()
        self._consume.shutdown()
        with self._table_lock:
            queues = list(self._table)
            for pq in self._table.values():
                pq.dropped = True
        self._persist_offsets(queues)
        if self.orderly and self._clustering:
            self._unlock(queues)
        self._scheduler.stop()
        self._session.stop(unregister=True)
        self._route.stop()
        self._channels.close()

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def owned_queues(self) -> list[MessageQueue]:
        with self._table_lock:
            return sorted(self._table)

    def process_queue(self, queue: MessageQueue) -> ProcessQueue[ReceivedMessage] | None:
        with self._table_lock:
            return self._table.get(queue)

    def request_rebalance(self) -> None:
        self._rebalancer.request()

    # -- rebalance ---------------------------------------------------------------------

    def _add_queue(self, queue: MessageQueue, expression: str) -> bool:
        if self._stopped.is_set():
            return False
        pq: ProcessQueue[ReceivedMessage] = ProcessQueue()
        if self.orderly and self._clustering and not self._lock_queues([queue], {queue: pq}):
            log.info("%s is still locked by another member; trying again soon", queue)
            self._scheduler.call_later(RETRY_REBALANCE_S, self.request_rebalance)
            return False
        self.offsets.remove(queue)  # a stale offset from an earlier ownership
        try:
            offset = start_offset(self.offsets, self._calls, self.options, queue, self._replicas)
        except ClientError as exc:
            log.warning("cannot start %s: %s", queue, exc)
            if self.orderly and self._clustering:
                self._unlock([queue])
            return False
        with self._table_lock:
            replaced = self._table.get(queue)
            self._table[queue] = pq
        if replaced is not None and not replaced.dropped:
            # Never two pull loops on one queue: each would consume every message.
            log.warning("%s: %s was taken up twice; the older one stops", self.client_id, queue)
            replaced.dropped = True
        self.metrics.owned_queues.inc()
        log.info("%s: consuming %s from offset %d", self.client_id, queue, offset)
        self._pull.pull_now(PullRequest(queue, pq, offset, expression))
        return True

    def _remove_queue(self, queue: MessageQueue) -> bool:
        with self._table_lock:
            pq = self._table.get(queue)
        if pq is None:
            return True
        if isinstance(self._consume, ConsumeOrderlyService) and self._clustering:
            if not self._let_go_locked_queue(queue, pq, self._consume):
                return False
        else:
            pq.dropped = True
            self._persist_offsets([queue])
        self.offsets.remove(queue)
        with self._table_lock:
            self._table.pop(queue, None)
        log.info("%s: let go of %s", self.client_id, queue)
        return True

    def _let_go_locked_queue(
        self,
        queue: MessageQueue,
        pq: ProcessQueue[ReceivedMessage],
        consume: ConsumeOrderlyService,
    ) -> bool:
        """Orderly: no further batch starts; the running one finishes and commits its
        offset; only then is the offset persisted and the broker lock released, so the
        next owner neither overlaps the batch nor consumes it again. False while the batch
        still runs: the queue stays ours (pulled, its lock renewed) and another rebalance
        comes soon; if that one gives the queue back to us, `_keep_queue` resumes it."""
        consume.hold(pq)
        if not pq.consume_lock.acquire(timeout=REMOVE_WAIT_S):
            log.info("%s: a batch is still running; letting go of it soon", queue)
            self._scheduler.call_later(RETRY_REBALANCE_S, self.request_rebalance)
            return False
        try:
            pq.dropped = True
            self._persist_offsets([queue])
            self._unlock([queue])
        finally:
            pq.consume_lock.release()
            consume.unhold(pq, queue)
        return True

    def _keep_queue(self, queue: MessageQueue) -> bool:
        """The rebalance keeps `queue` ours: call off a removal still waiting for a batch.
        False when its ProcessQueue is gone (the rebalance takes the queue up afresh).
        A dropped one still here is the pull service's (an illegal offset being
        corrected): it hands the queue back through `_dropped_by_pull`."""
        with self._table_lock:
            pq = self._table.get(queue)
        if pq is None:
            return False
        if isinstance(self._consume, ConsumeOrderlyService):
            self._consume.unhold(pq, queue)
        return True

    def _apply_reset(self, address: str, reset: list[tuple[str, int, int]]) -> None:
        """An admin moved the group's offsets on the broker at `address`: drop what is
        cached of those queues, forget their offsets here (never committing them over the
        reset) and let the next rebalance take them up from the new committed offsets."""
        if not self._clustering:
            log.info("%s: offset reset ignored: broadcasting keeps offsets locally", self.group)
            return
        moved = {(topic, qid): offset for topic, qid, offset in reset}
        taken_back = []
        for queue in self._rebalance.owned():
            if (queue.topic, queue.queue_id) not in moved or not self._served_at(queue, address):
                continue
            pq = self._forget_queue(queue)
            if pq is not None and self.orderly and pq.consume_lock.acquire(timeout=REMOVE_WAIT_S):
                pq.consume_lock.release()  # the running batch is done
            taken_back.append(queue)
        if taken_back and isinstance(self.offsets, RemoteOffsetStore):
            self.offsets.reassert({q: moved[(q.topic, q.queue_id)] for q in taken_back})
        if taken_back:
            log.info(
                "%s: offsets reset by an admin; consuming %s again from %s",
                self.client_id,
                ", ".join(map(str, taken_back)),
                ", ".join(str(moved[(q.topic, q.queue_id)]) for q in taken_back),
            )
            self.request_rebalance()

    def _forget_queue(self, queue: MessageQueue) -> ProcessQueue[ReceivedMessage] | None:
        """Let go of `queue` and its offset between two rebalance rounds; its ProcessQueue."""
        popped: ProcessQueue[ReceivedMessage] | None = None

        def release() -> bool:
            nonlocal popped
            with self._table_lock:
                popped = self._table.pop(queue, None)
            self.offsets.forget(queue, popped)
            return True

        self._rebalance.forget(queue, release)
        return popped

    def _dropped_by_pull(self, queue: MessageQueue, pq: ProcessQueue[ReceivedMessage]) -> None:
        def release() -> bool:
            with self._table_lock:
                if self._table.get(queue) is not pq:
                    return False  # taken up afresh meanwhile: that one stays
                del self._table[queue]
                return True

        if self._rebalance.forget(queue, release):
            self.request_rebalance()

    # -- pull → consume ----------------------------------------------------------------

    def _deliver(self, request: PullRequest, messages: list[ReceivedMessage], added: int) -> None:
        if messages:
            self._consume.submit(messages, request.process_queue, request.queue)

    # -- offsets and locks -------------------------------------------------------------

    def _persist_offsets(self, queues: list[MessageQueue] | None = None) -> None:
        if queues is None:
            with self._table_lock:
                queues = list(self._table)
        self.offsets.persist(queues)

    def _served_at(self, queue: MessageQueue, address: str) -> bool:
        """Whether `address` is a replica of the queue's broker group (as its route says)."""
        entry = self._replicas.route_queue(queue)
        return entry is not None and address in entry.addresses

    def _lock_queues(
        self,
        queues: list[MessageQueue],
        pqs: dict[MessageQueue, ProcessQueue[ReceivedMessage]],
    ) -> bool:
        """Lock (or renew) on each queue's broker group; mark each ProcessQueue; whether
        all were held. A group whose every replica failed leaves its queues' marks as they
        were: a lock held stays held until its lease runs out (RocketMQ keeps the locked
        flags when its lock call throws), and the renewal is tried again within
        RENEW_RETRY_S."""
        answers = self._replicas.call_each_group(queues, "lock", self._calls.lock)
        now = time.monotonic()
        unanswered = []
        for group, answer in answers.items():
            part = [q for q in queues if q.broker_name == group]
            if isinstance(answer, ClientError):
                log.warning("queue lock at group %s failed: %s", group, answer)
                unanswered.extend(part)
                continue
            held, expiry_s = answer
            for queue in part:
                pq = pqs.get(queue)
                if pq is None:
                    continue
                pq.locked = (queue.topic, queue.queue_id) in held
                if pq.locked:
                    pq.last_lock_at = now
                    if expiry_s > 0:
                        pq.lock_lease_s = lock_lease_s(expiry_s)
        if unanswered and not self._stopped.is_set():
            self._scheduler.call_later(RENEW_RETRY_S, lambda: self._renew(unanswered))
        return not unanswered and all(pqs.get(q) is None or pqs[q].locked for q in queues)

    def _renew(self, queues: list[MessageQueue]) -> None:
        """Renew the locks of those of `queues` still ours (after a failed renewal)."""
        with self._table_lock:
            table = {q: self._table[q] for q in queues if q in self._table}
        if table and not self._stopped.is_set():
            self._lock_queues(list(table), table)

    def _lock_one(self, queue: MessageQueue, pq: ProcessQueue[ReceivedMessage]) -> bool:
        return self._lock_queues([queue], {queue: pq})

    def _lock_all(self) -> None:
        with self._table_lock:
            table = dict(self._table)
        if table:
            self._lock_queues(list(table), table)

    def _unlock(self, queues: list[MessageQueue]) -> None:
        answers = self._replicas.call_each_group(queues, "unlock", self._calls.unlock)
        for group, answer in answers.items():
            if isinstance(answer, ClientError):
                log.warning("unlock at group %s failed (the locks lapse): %s", group, answer)
