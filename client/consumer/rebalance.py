"""RebalanceImpl (seed 000): which of a topic's queues this member consumes.

For each subscribed topic: the sorted readable queues of its route and the sorted member
ids of the group go through the allocation strategy, and this member's share is compared
with the queues it holds. Queues no longer its own are handed to `remove` (which may
refuse for now, e.g. while an orderly batch is still running: the queue stays held and is
tried again at the next rebalance); new ones to `add`; the ones it keeps to `keep` (which
calls off a removal still pending, and says whether the queue is still consumed: if not,
it is removed and added afresh, from its committed offset, rather than left owned but
idle). In broadcasting mode every queue is this member's.

The sticky strategy needs each queue's current owner: members report the queues they own
in their heartbeats, and the broker's member list carries them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from capstan.client.consumer.broker_calls import BrokerCalls
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.queue_replicas import QueueReplicas
from capstan.client.consumer.settings import ALLOCATION_STRATEGIES, ConsumerOptions, MessageModel
from capstan.client.errors import ClientError
from capstan.client.metrics import ConsumerMetrics
from capstan.client.route import RouteCache

log = logging.getLogger(__name__)

AddQueue = Callable[[MessageQueue, str], bool]
"""(queue, tag expression) → whether the queue was taken up (its calls go to whichever
replica of its group serves: queue_replicas.py)."""
RemoveQueue = Callable[[MessageQueue], bool]
"""queue → whether it was let go (False: try again at the next rebalance)."""
KeepQueue = Callable[[MessageQueue], bool]
"""queue (owned and still assigned) → whether it is still consumed (False: take it afresh)."""


def _always(queue: MessageQueue) -> bool:
    return True


NOTIFY_DEBOUNCE_S = 0.05
"""One rebalance round for a burst of member-change notifications."""


class RebalanceImpl:
    def __init__(
        self,
        client_id: str,
        options: ConsumerOptions,
        route: RouteCache,
        calls: BrokerCalls,
        replicas: QueueReplicas,
        add: AddQueue,
        remove: RemoveQueue,
        keep: KeepQueue = _always,
    ) -> None:
        self._client_id = client_id
        self._options = options
        self._route = route
        self._calls = calls
        self._replicas = replicas
        self._add = add
        self._remove = remove
        self._keep = keep
        self._allocate = ALLOCATION_STRATEGIES[options.allocation]
        self._lock = threading.Lock()
        self.subscriptions: dict[str, str] = {}
        self._owned: set[MessageQueue] = set()

    def owned(self) -> set[MessageQueue]:
        with self._lock:
            return set(self._owned)

    def addresses(self) -> set[str]:
        """The replica in use of every broker group serving a subscribed topic (as far as
        the cached routes know)."""
        found = set()
        for topic in list(self.subscriptions):
            groups = {rq.broker_name: rq for rq in self._route.cached(topic) or []}
            for rq in groups.values():
                address = self._replicas.address(MessageQueue(topic, rq.broker_name, rq.queue_id))
                if address is not None:
                    found.add(address)
        return found

    def rebalance(self) -> bool:
        """One round over every subscribed topic; whether this member's queues changed."""
        changed = False
        with self._lock:
            for topic, expression in list(self.subscriptions.items()):
                try:
                    mine = self._share(topic)
                except ClientError as exc:
                    log.warning("rebalance of %s skipped: %s", topic, exc)
                    continue
                if mine is not None:
                    changed |= self._apply(topic, mine, expression)
        return changed

    def forget(self, queue: MessageQueue, release: Callable[[], bool]) -> bool:
        """The queue is dropped from outside (an illegal offset, an admin's reset): the
        next round adds it afresh. `release` lets go of its ProcessQueue (False: it is not
        the one to let go, and nothing changes); it runs between rounds, never inside
        one, or that round would find the queue owned but unconsumed, take it up, and the
        round after, no longer finding it owned, take it up a second time."""
        with self._lock:
            if not release():
                return False
            self._owned.discard(queue)
            return True

    def _share(self, topic: str) -> set[MessageQueue] | None:
        readable = {
            MessageQueue(topic, rq.broker_name, rq.queue_id)
            for rq in self._route.read_queues(topic)
        }
        if self._options.message_model is MessageModel.BROADCASTING:
            return readable
        if not readable:
            return set()
        first = min(readable)
        members = self._replicas.call(first, "member list", self._calls.members)
        ids = sorted(m.client_id for m in members)
        if self._client_id not in ids:
            log.info("rebalance of %s waits: this client is not a member of %s yet", topic, first)
            return None
        previous: dict[MessageQueue, str] = {}
        for m in members:
            for ref in m.owned:
                previous.setdefault(
                    MessageQueue(ref.topic, ref.broker_name, ref.queue_id), m.client_id
                )
        assignment = self._allocate(sorted(readable), ids, previous)
        return set(assignment.get(self._client_id, []))

    def _apply(self, topic: str, mine: set[MessageQueue], expression: str) -> bool:
        changed = False
        for queue in [q for q in self._owned if q.topic == topic and q not in mine]:
            changed |= self._let_go(queue)
        for queue in sorted(mine):
            if queue in self._owned:
                if self._keep(queue):
                    continue
                if not self._let_go(queue):  # not consumed, and not yet let go either
                    continue
                changed = True
            if self._add(queue, expression):
                self._owned.add(queue)
                changed = True
        return changed

    def _let_go(self, queue: MessageQueue) -> bool:
        if not self._remove(queue):
            return False
        self._owned.discard(queue)
        return True


class RebalanceService:
    """RocketMQ's RebalanceService: a thread running a RebalanceImpl every
    `interval_s` and soon after `request()` (a member-change notification).
    `after_change` runs when this member's queues changed (to tell the others)."""

    def __init__(
        self,
        impl: RebalanceImpl,
        interval_s: float,
        metrics: ConsumerMetrics,
        after_change: Callable[[], None],
    ) -> None:
        self._impl = impl
        self._interval_s = interval_s
        self._metrics = metrics
        self._after_change = after_change
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="capstan-rebalance", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def request(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        trigger = "start"
        while not self._stopped.is_set():
            try:
                self._metrics.rebalanced(trigger)
                if self._impl.rebalance():
                    self._after_change()
            except Exception:
                log.exception("rebalance failed")
            woken = self._wake.wait(self._interval_s)
            if woken:
                time.sleep(NOTIFY_DEBOUNCE_S)
            self._wake.clear()
            trigger = "notify" if woken else "timer"
