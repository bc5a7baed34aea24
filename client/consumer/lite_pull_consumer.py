"""LitePullConsumer: RocketMQ's DefaultLitePullConsumer, messages handed out by `poll()`.

    consumer = LitePullConsumer(["127.0.0.1:8081"], "my-group")
    consumer.subscribe("orders")  # or consumer.assign(consumer.fetch_message_queues("orders"))
    with consumer:
        while running:
            for message in consumer.poll():
                handle(message)

`subscribe()` lets the group's rebalance choose the queues (GroupSession and RebalanceImpl,
as the PushConsumer uses them, consume type LITE_PULL; no retry topic, as nothing is sent
back); `assign()` names them and joins no group. A consumer does one or the other.
LitePullService pulls the queues in the background into a bounded buffer that `poll()`
takes from.

Offsets: `poll()` moves a queue's consumed offset past what it returned. With auto commit
(RocketMQ's and Kafka's semantics) the consumed offsets are committed at the start of a
`poll()` once `auto_commit_interval_s` has passed since the last time, so a batch counts
as processed when a later poll begins; and when a rebalance takes a queue away, and at
shutdown. Without auto commit only `commit_sync` / `commit_async` commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from capstan.client.channels import ChannelPool, new_client_id
from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.group_session import GroupSession
from capstan.client.consumer.lite_pull_service import LitePullService
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.offset_store import RemoteOffsetStore, start_offset
from capstan.client.consumer.queue_replicas import QueueReplicas
from capstan.client.consumer.rebalance import RebalanceImpl, RebalanceService
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import ConsumerOptions, MessageModel
from capstan.client.errors import ClientError
from capstan.client.metrics import ConsumerMetrics
from capstan.client.route import RouteCache
from capstan.security.signature import Credentials
from capstan.v1 import consumer_pb2 as c

log = logging.getLogger(__name__)


class LitePullConsumer:
    def __init__(
        self,
        endpoints: list[str] | str,
        group: str,
        *,
        options: ConsumerOptions | None = None,
        client_id: str | None = None,
        auto_commit: bool = True,
        auto_commit_interval_s: float = 5.0,
        poll_timeout_s: float = 5.0,
        credentials: Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.group = group
        self.options = options or ConsumerOptions()
        if self.options.message_model is not MessageModel.CLUSTERING:
            raise ValueError("LitePullConsumer supports the CLUSTERING message model only")
        if auto_commit_interval_s <= 0 or poll_timeout_s < 0:
            raise ValueError("auto_commit_interval_s must be positive, poll_timeout_s >= 0")
        self.client_id = client_id or new_client_id()
        self.auto_commit = auto_commit
        self._auto_commit_interval_s = auto_commit_interval_s
        self._poll_timeout_s = poll_timeout_s
        endpoint_list = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        self._channels = ChannelPool(credentials, ca_file)
        self._route = RouteCache(
            endpoint_list, self._channels, self.client_id, self.options.route_refresh_s
        )
        self._calls = BrokerCalls(self._channels, self.client_id, group)
        self.metrics = ConsumerMetrics(group, self.client_id)
        self._replicas = QueueReplicas(self._route)
        self._pull = LitePullService(self._calls, self._replicas, self.options, self.metrics)
        self._rebalance = RebalanceImpl(
            self.client_id,
            self.options,
            self._route,
            self._calls,
            self._replicas,
            self._add_queue,
            self._remove_queue,
        )
        self._offsets = RemoteOffsetStore(self._calls, self._replicas)
        self._session = GroupSession(
            self._calls,
            c.CLUSTERING,
            c.LITE_PULL,
            False,
            lambda: dict(self._rebalance.subscriptions),
            lambda: list(self._rebalance.owned()),
            self._rebalance.addresses,
            lambda: self._rebalancer.request(),
            self.options.heartbeat_interval_s,
            self._apply_reset,
        )
        self._committer = ThreadPoolExecutor(1, thread_name_prefix="capstan-commit")
        self._stopped = threading.Event()
        self._rebalancer = RebalanceService(
            self._rebalance,
            self.options.rebalance_interval_s,
            self.metrics,
            self._session.heartbeat_all,  # tell the others what we own now
        )
        self._route.watch(lambda topic: self._rebalancer.request())  # queues came or went
        self._mode: str | None = None  # "subscribe" or "assign"
        self._to_assign: list[MessageQueue] = []
        self._next_auto_commit = 0.0
        self._started = False

    # -- lifecycle -----------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume `topic` (tags "a||b", or "*") on the queues the group's rebalance gives."""
        self._choose_mode("subscribe")
        if self._started:
            raise RuntimeError("subscribe before start()")
        self._rebalance.subscriptions[topic] = expression.strip() or "*"

    def assign(self, queues: Iterable[MessageQueue]) -> None:
        """Consume exactly these queues, without a group rebalance; call again to change
        them (the queues left out are let go of, as by a rebalance)."""
        self._choose_mode("assign")
        wanted = sorted(set(queues))
        if not self._started:
            self._to_assign = wanted
            return
        self._check_running()
        self._apply_assignment(wanted)

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of a topic (what `assign` takes)."""
        return [
            MessageQueue(topic, rq.broker_name, rq.queue_id)
            for rq in self._route.read_queues(topic)
        ]

    def start(self) -> LitePullConsumer:
        if self._started:
            raise RuntimeError("start() was already called")
        if self._mode is None:
            raise RuntimeError("subscribe() or assign() before start()")
        for topic in self._rebalance.subscriptions:
            self._route.queues(topic)  # an unknown topic fails here, clearly
        self._started = True
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
        self._route.start()
        self._pull.start()
        try:
            if self._mode == "assign":
                self._apply_assignment(self._to_assign)
            else:
                self._session.start()
                self._rebalancer.start()
        except BaseException:
            self.shutdown()
            raise
        return self

    def shutdown(self) -> None:
        """Stop pulling, commit what was polled (with auto commit), leave the group."""
        if not self._started or self._stopped.is_set():
            return
        self._stopped.set()
        self._rebalancer.stop()
        self._pull.stop()
        self._committer.shutdown(wait=True)  # commit_async calls made before this
        if self.auto_commit:
            self._commit_quietly(self._pull.consumed())
        if self._mode == "subscribe":
            self._session.stop(unregister=True)
        self._route.stop()
        self._channels.close()

    def __enter__(self) -> LitePullConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _choose_mode(self, mode: str) -> None:
        if self._mode not in (None, mode):
            raise RuntimeError("a consumer either subscribes or assigns, not both")
        self._mode = mode

    def _check_running(self) -> None:
        if not self._started or self._stopped.is_set():
            raise RuntimeError("the consumer is not running (start() it; not after shutdown())")

    # -- poll and offsets ----------------------------------------------------------------

    def poll(self, timeout_s: float | None = None) -> list[ReceivedMessage]:
        """Up to `pull_batch_size` buffered messages, in order within each queue; waits up
        to `timeout_s` (default `poll_timeout_s`) for some, else returns []."""
        self._check_running()
        if self.auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
            self._commit_quietly(self._pull.consumed())
        wait_s = self._poll_timeout_s if timeout_s is None else timeout_s
        return self._pull.take(self.options.pull_batch_size, wait_s)

    def commit_sync(self, offsets: dict[MessageQueue, int] | None = None) -> None:
        """Commit `offsets` (each the next offset to consume), or by default the offsets
        after everything polled so far; a broker refusing or down raises ClientError."""
        self._commit(self._chosen(offsets))

    def commit_async(self, offsets: dict[MessageQueue, int] | None = None) -> Future[None]:
        """As commit_sync, in the background (one at a time, in call order); the default
        offsets are those at the call."""
        return self._committer.submit(self._commit, self._chosen(offsets))

    def committed(self, queue: MessageQueue) -> int:
        """The group's committed offset of `queue` as its broker has it, or -1 if none."""
        return self._replicas.call(
            queue, "offset query", lambda address: self._calls.query_offset(address, queue)
        )

    def _chosen(self, offsets: dict[MessageQueue, int] | None) -> dict[MessageQueue, int]:
        self._check_running()
        if offsets is None:
            return self._pull.consumed()
        for queue, offset in offsets.items():
            if offset < 0:
                raise ValueError(f"cannot commit offset {offset} of {queue}")
        return dict(offsets)

    def _commit(self, offsets: dict[MessageQueue, int]) -> None:
        def commit(address: str, queues: list[MessageQueue]) -> None:
            self._calls.commit_offsets(address, {q: offsets[q] for q in queues})

        self._readable(list(offsets))  # a queue of no route fails clearly
        answers = self._replicas.call_each_group(list(offsets), "offset commit", commit)
        for answer in answers.values():
            if isinstance(answer, ClientError):
                raise answer

    def _commit_quietly(self, offsets: dict[MessageQueue, int]) -> None:
        """Commit the background's way: a failure is logged, the next commit repeats it."""
        for queue, offset in offsets.items():
            self._offsets.update(queue, offset, increase_only=False)
        self._offsets.persist(offsets)

    # -- seek, pause, assignment ----------------------------------------------------------

    def seek(self, queue: MessageQueue, offset: int) -> None:
        """Drop what is buffered of `queue`; the next messages start at `offset`, which must
        lie within the queue's min..max offset (max: where the next message will go)."""
        low, high = self._bounds(queue)
        if not low <= offset <= high:
            raise ValueError(f"offset {offset} of {queue} is outside {low}..{high}")
        self._pull.reposition(queue, offset)

    def seek_to_begin(self, queue: MessageQueue) -> None:
        self._pull.reposition(queue, self._bounds(queue)[0])

    def seek_to_end(self, queue: MessageQueue) -> None:
        self._pull.reposition(queue, self._bounds(queue)[1])

    def pause(self, queues: Iterable[MessageQueue]) -> None:
        """Stop pulling these queues, and poll holds back what is buffered of them. Queues
        not assigned (now) are ignored, as in RocketMQ."""
        self._pull.set_paused(queues, True)

    def resume(self, queues: Iterable[MessageQueue]) -> None:
        self._pull.set_paused(queues, False)

    def assignment(self) -> list[MessageQueue]:
        """The queues this consumer holds now (subscribed: as the last rebalance left them)."""
        return self._pull.queues()

    def offset_range(self, queue: MessageQueue) -> tuple[int, int]:
        """(first, end) of an assigned queue as its broker holds it now: the first offset
        still stored and where the next message will go (Kafka's beginning and end
        offsets), so a reader knows when it has read everything sent before it asked."""
        return self._bounds(queue)

    def _bounds(self, queue: MessageQueue) -> tuple[int, int]:
        self._check_running()
        if queue not in self._pull.queues():
            raise ValueError(f"{queue} is not assigned to this consumer")
        return self._replicas.call(
            queue, "queue bounds", lambda address: self._calls.queue_bounds(address, queue)
        )

    # -- taking up and letting go of queues ------------------------------------------------

    def _apply_assignment(self, wanted: list[MessageQueue]) -> None:
        self._readable(wanted)
        for queue in self._pull.queues():
            if queue not in wanted:
                self._remove_queue(queue)
        held = set(self._pull.queues())
        for queue in wanted:
            if queue not in held:
                self._take_up(queue, "*")

    def _add_queue(self, queue: MessageQueue, expression: str) -> bool:
        """RebalanceImpl's add hook."""
        if self._stopped.is_set():
            return False
        try:
            self._take_up(queue, expression)
        except ClientError as exc:
            log.warning("cannot start %s: %s", queue, exc)
            return False
        return True

    def _take_up(self, queue: MessageQueue, expression: str) -> None:
        self._offsets.remove(queue)  # a stale offset from an earlier ownership
        offset = start_offset(self._offsets, self._calls, self.options, queue, self._replicas)
        self._pull.add(queue, expression, offset)
        self.metrics.owned_queues.inc()
        log.info("%s: consuming %s from offset %d", self.client_id, queue, offset)

    def _remove_queue(self, queue: MessageQueue) -> bool:
        """RebalanceImpl's remove hook (and assign's): drop its buffer, commit, forget it."""
        held = self._pull.remove(queue)
        if held is not None and self.auto_commit:
            self._commit_quietly({queue: held.consumed})
        self._offsets.remove(queue)
        log.info("%s: let go of %s", self.client_id, queue)
        return True

    def _apply_reset(self, address: str, reset: list[tuple[str, int, int]]) -> None:
        """An admin moved the group's offsets on the broker at `address`: the queues held
        of its group go on from the new offsets, as after a seek."""
        moved = {(topic, qid): offset for topic, qid, offset in reset}
        for queue in self._pull.queues():
            offset = moved.get((queue.topic, queue.queue_id))
            entry = self._replicas.route_queue(queue)
            if offset is None or entry is None or address not in entry.addresses:
                continue
            try:
                self._pull.reposition(queue, offset)
            except ValueError:
                continue  # let go of meanwhile
            self._offsets.update(queue, offset, increase_only=False)
            log.info("%s: offset of %s reset by an admin to %d", self.client_id, queue, offset)

    def _readable(self, queues: list[MessageQueue]) -> None:
        """Raise ValueError unless each queue is a readable queue of its topic's route."""
        for topic in sorted({q.topic for q in queues}):
            served = {(r.broker_name, r.queue_id) for r in self._route.read_queues(topic)}
            for queue in (q for q in queues if q.topic == topic):
                if (queue.broker_name, queue.queue_id) not in served:
                    raise ValueError(f"{queue} is not a readable queue of topic {topic!r}")

    # -- rebalance (subscribe mode) --------------------------------------------------------
