"""The producer: sends messages to a topic's queues over `apache.rocketmq.v2` SendMessage.

Each send looks the topic's writable queues up in the route cache, lets a selector pick
one, and sends to that queue's broker, naming the queue in the `x-capstan-queue-id`
metadata. Failures are retried as `retry.py` decides: a retriable failure moves to another
broker group, a refusal is raised at once. `send` blocks; `send_async` returns a future
completed from gRPC's own completion thread, so nothing waits on a thread per send.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.client import wire
from capstan.client.channels import ChannelPool, call_metadata, new_client_id
from capstan.client.errors import (
    ClientError,
    RequestRefused,
    TopicNotFound,
    TransportError,
    from_exception,
    from_status,
)
from capstan.client.message import Message, MessageType, SendReceipt
from capstan.client.producer import retry
from capstan.client.producer.queue_selectors import (
    DefaultSelector,
    QueueSelector,
    Selector,
    routed_by_key,
)
from capstan.client.producer.queue_selectors import as_selector as _as_selector
from capstan.client.replica_choice import ReplicaChoice
from capstan.client.route import RouteCache, RouteQueue
from capstan.common.message_id import new_message_id
from capstan.security.signature import Credentials

log = logging.getLogger(__name__)

QUEUE_ID_METADATA = "x-capstan-queue-id"
"""Request metadata: the queue the producer chose for every message of the request."""

STORED_QUEUES_METADATA = "x-capstan-queue-ids"
"""Trailing metadata a broker may answer with: the queue id each message was stored in,
comma-separated in request order. Without it a receipt's queue_id is None."""

_WORKERS = 4
"""Threads for the work an async send must not do on gRPC's completion thread: a route
lookup (a blocking QueryRoute) and the pause before retrying on the same broker."""


@dataclass(eq=False)
class _Job:
    """One send (a message or a batch) across its attempts."""

    topic: str
    first: Message
    wire: list[pb.Message]
    message_type: MessageType
    selector: QueueSelector
    max_attempts: int
    attempts: int = 0
    failed_brokers: set[str] = field(default_factory=set)
    pinned: RouteQueue | None = None
    """The queue of the first attempt, which every retry uses too: for a FIFO message or
    one routed by its key."""
    queue: RouteQueue | None = None
    """The queue of the current attempt (None until one is chosen)."""
    address: str = ""
    """The replica of the queue's group the current attempt calls."""
    started: float = field(default_factory=time.monotonic)
    done: Callable[[_Sent | None, ClientError | None], None] | None = None

    @property
    def fifo(self) -> bool:
        return self.first.message_group is not None

    @property
    def stays(self) -> bool:
        """Whether its retries stay on the first attempt's queue."""
        return self.pinned is not None


@dataclass(frozen=True, slots=True)
class _Sent:
    receipts: list[SendReceipt]
    queue: RouteQueue
    address: str
    """The replica that stored it."""


class Producer:
    """Sends messages; thread-safe. `start()` it (or use it as a context manager) first.

    `endpoints`: a list of "host:port" (or one string, several separated by ';'); a
    topic's route is the union of what each answers. `send_timeout_s`: deadline of one
    SendMessage attempt, in seconds. `max_attempts`: tries per send, the first included,
    for retriable failures. `retry_window_s`: besides, how long a send keeps retrying a
    retriable failure, in seconds, pausing as `retry.py` says (a group whose master died is
    served again once the next is elected, in seconds); 0 leaves it to `max_attempts`.
    `route_refresh_s`: how often cached routes are asked for again, in seconds.
    `client_id`: how brokers know this client (a unique one by default). `credentials`:
    the keys every call is signed with (a broker with authentication on refuses unsigned
    calls). `ca_file`: TLS, trusting the CA in that PEM file (default plaintext).

    A send goes to the replica of the queue's group that served last, and moves on to the
    next replica after one that could not (`replica_choice.py`).
    """

    def __init__(
        self,
        endpoints: list[str] | str,
        *,
        send_timeout_s: float = 3.0,
        max_attempts: int = 3,
        retry_window_s: float = 0.0,
        route_refresh_s: float = 30.0,
        client_id: str | None = None,
        credentials: Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        if send_timeout_s <= 0:
            raise ValueError("send_timeout_s must be positive")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if retry_window_s < 0:
            raise ValueError("retry_window_s must not be negative")
        if isinstance(endpoints, str):  # "host:port", or several as in "a:8081;b:8081"
            endpoints = [e for e in endpoints.replace(",", ";").split(";") if e.strip()]
        self.endpoints = [e.strip() for e in endpoints]
        self.client_id = client_id or new_client_id()
        self.send_timeout_s = send_timeout_s
        self.max_attempts = max_attempts
        self.retry_window_s = retry_window_s
        self._replicas = ReplicaChoice()
        self._channels = ChannelPool(credentials, ca_file)
        self._routes = RouteCache(self.endpoints, self._channels, self.client_id, route_refresh_s)
        self._metadata = call_metadata(self.client_id)
        self._default_selector = DefaultSelector()
        self._stubs: dict[str, svc_grpc.MessagingServiceStub] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._state_changed = threading.Condition()
        self._state = "created"  # -> started -> stopping -> stopped
        self._inflight = 0

    @property
    def routes(self) -> RouteCache:
        """The producer's route cache (shared by its sends)."""
        return self._routes

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        with self._state_changed:
            if self._state == "started":
                return self
            if self._state != "created":
                raise RuntimeError("a producer that was shut down cannot start again")
            self._executor = ThreadPoolExecutor(_WORKERS, thread_name_prefix="capstan-producer")
            self._state = "started"
        self._routes.start()
        return self

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Refuse new sends, let those under way finish for up to `timeout_s` seconds, then
        cancel what is left and close the connections."""
        with self._state_changed:
            if self._state in ("stopping", "stopped"):
                return
            self._state = "stopping"
            self._state_changed.wait_for(lambda: self._inflight == 0, timeout_s)
        self._routes.stop()
        self._channels.close()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        with self._state_changed:
            self._state = "stopped"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # -- sending -----------------------------------------------------------------------

    def send(self, message: Message, selector: Selector | None = None) -> SendReceipt:
        """Send and wait for the broker's answer. Raises ClientError (its `retriable` and
        `attempts` say why and how often it was tried)."""
        return self._run_sync(self._job([message], selector)).receipts[0]

    def send_async(self, message: Message, selector: Selector | None = None) -> Future[SendReceipt]:
        """Send without waiting; the future completes with the receipt or a ClientError.
        Callbacks added to it run on an SDK thread: keep them short."""
        future: Future[SendReceipt] = Future()
        future.set_running_or_notify_cancel()

        def done(sent: _Sent | None, error: ClientError | None) -> None:
            if sent is not None:
                future.set_result(sent.receipts[0])
            else:
                future.set_exception(error or ClientError("send failed"))

        self._start_async(self._job([message], selector), done)
        return future

    def send_oneway(self, message: Message) -> None:
        """Send once, without waiting and without retrying; a failure is only logged."""

        def done(sent: _Sent | None, error: ClientError | None) -> None:
            if error is not None:
                log.warning("one-way send to %s failed: %s", message.topic, error)

        self._start_async(self._job([message], None, max_attempts=1), done)

    def send_batch(
        self, messages: Iterable[Message], selector: Selector | None = None
    ) -> list[SendReceipt]:
        """Send several messages of one topic in one request, to one queue, in order.
        FIFO messages of a batch must share their message group."""
        batch = list(messages)
        if not batch:
            raise ValueError("a batch needs at least one message")
        topic, group = batch[0].topic, batch[0].message_group
        for m in batch:
            if m.topic != topic:
                raise ValueError(f"a batch goes to one topic: {m.topic!r} is not {topic!r}")
            if m.message_group != group:
                raise ValueError("the messages of a batch must share their message group")
        return self._run_sync(self._job(batch, selector)).receipts

    # -- one send, across its attempts --------------------------------------------------

    def _job(
        self,
        messages: list[Message],
        selector: Selector | None,
        *,
        transactional: bool = False,
        max_attempts: int | None = None,
    ) -> _Job:
        for m in messages:
            m.validate()
        types = [MessageType.TRANSACTION if transactional else m.message_type for m in messages]
        return _Job(
            topic=messages[0].topic,
            first=messages[0],
            wire=[wire.to_v2(m, new_message_id(), t) for m, t in zip(messages, types, strict=True)],
            message_type=types[0],
            selector=self._default_selector if selector is None else _as_selector(selector),
            max_attempts=max_attempts or self.max_attempts,
        )

    def _enter(self) -> None:
        with self._state_changed:
            if self._state != "started":
                raise RuntimeError(f"the producer is {self._state}, not started")
            self._inflight += 1

    def _leave(self) -> None:
        with self._state_changed:
            self._inflight -= 1
            self._state_changed.notify_all()

    def _run_sync(self, job: _Job) -> _Sent:
        self._enter()
        try:
            while True:
                try:
                    return self._attempt_sync(job)
                except ClientError as error:
                    pause = self._after_failure(job, error)
                    if pause is None:
                        raise
                    time.sleep(pause)
        finally:
            self._leave()

    def _attempt_sync(self, job: _Job) -> _Sent:
        queue = self._begin_attempt(job)
        try:
            response, call = self._stub(job.address).SendMessage.with_call(
                svc.SendMessageRequest(messages=job.wire),
                timeout=self.send_timeout_s,
                metadata=self._send_metadata(queue),
            )
        except (grpc.RpcError, ValueError, RuntimeError) as exc:  # ValueError: channel closed
            raise from_exception(exc, _context(queue, job.address)) from None
        return self._parse(job, queue, response, call.trailing_metadata())

    def _start_async(
        self, job: _Job, done: Callable[[_Sent | None, ClientError | None], None]
    ) -> None:
        self._enter()

        def finish(sent: _Sent | None, error: ClientError | None) -> None:
            self._leave()
            done(sent, error)

        job.done = finish
        if self._routes.cached(job.topic) is None:
            self._later(job, 0.0)  # the route lookup blocks: not on the caller's thread
        else:
            self._attempt_async(job)

    def _attempt_async(self, job: _Job) -> None:
        try:
            queue = self._begin_attempt(job)
            call = self._stub(job.address).SendMessage.future(
                svc.SendMessageRequest(messages=job.wire),
                timeout=self.send_timeout_s,
                metadata=self._send_metadata(queue),
            )
        except Exception as exc:  # noqa: BLE001 - it completes the send's future
            self._async_failed(job, from_exception(exc, _context(job.queue, job.address)))
            return
        call.add_done_callback(lambda c: self._on_answer(job, queue, c))

    def _on_answer(self, job: _Job, queue: RouteQueue, call: Any) -> None:
        try:
            sent = self._parse(job, queue, call.result(), call.trailing_metadata())
        except Exception as exc:  # noqa: BLE001 - it completes the send's future
            self._async_failed(job, from_exception(exc, _context(queue, job.address)))
            return
        assert job.done is not None
        job.done(sent, None)

    def _async_failed(self, job: _Job, error: ClientError) -> None:
        assert job.done is not None
        pause = self._after_failure(job, error)
        if pause is None:
            job.done(None, error)
        elif pause == 0 and self._routes.cached(job.topic) is not None:
            self._attempt_async(job)
        else:
            self._later(job, pause)

    def _later(self, job: _Job, pause: float) -> None:
        def run() -> None:
            if pause:
                time.sleep(pause)
            self._attempt_async(job)

        assert self._executor is not None and job.done is not None
        try:
            self._executor.submit(run)
        except RuntimeError as exc:  # the executor is shut down
            job.done(None, ClientError(f"the producer shut down: {exc}", "CANCELLED"))

    # -- the decisions of one attempt ---------------------------------------------------

    def _begin_attempt(self, job: _Job) -> RouteQueue:
        """Count the attempt and choose its queue (raises ClientError when none can be)."""
        job.attempts += 1
        job.queue = None
        if job.pinned is not None:
            queue = job.pinned
        else:
            writable = self._routes.write_queues(job.topic)
            if not writable:
                raise RequestRefused(f"topic {job.topic!r} has no writable queue", "FORBIDDEN")
            candidates = retry.queues_for_attempt(writable, job.failed_brokers)
            if routed_by_key(writable, job.first):  # all of them: the key has one queue
                candidates = writable
            queue = job.selector.select(candidates, job.first)
            if queue not in candidates:
                raise RequestRefused(f"the selector chose {queue!r}, not one of the topic's")
            if job.fifo or routed_by_key(writable, job.first):
                job.pinned = queue
        job.queue = queue
        job.address = self._replicas.address(queue)
        self._before_send(queue, job.message_type)
        return queue

    def _before_send(self, queue: RouteQueue, message_type: MessageType) -> None:
        """Called before each attempt, with its queue; a hook for subclasses."""

    def _after_failure(self, job: _Job, error: ClientError) -> float | None:
        """Note a failed attempt; the pause before the next one, or None to give up."""
        if isinstance(error, TopicNotFound | TransportError):
            self._routes.invalidate(job.topic)
        if isinstance(error, TransportError) and job.queue is not None:
            self._replicas.failed(job.queue, job.address)
        if job.queue is not None and not job.stays:
            job.failed_brokers.add(job.queue.broker_name)
        started = self._state == "started"
        window_left = self.retry_window_s - (time.monotonic() - job.started)
        if not started or not retry.should_retry(
            error.retriable, job.attempts, job.max_attempts, window_left
        ):
            error.attempts = job.attempts
            return None
        log.info(
            "send to %s failed on attempt %d of %d, retrying: %s",
            job.topic,
            job.attempts,
            job.max_attempts,
            error,
        )
        return retry.backoff_s(job.attempts, self._same_broker_next(job))

    def _same_broker_next(self, job: _Job) -> bool:
        if job.stays:
            return True
        cached = self._routes.cached(job.topic)
        if cached is None:
            return False  # the route is asked for again first; that is pause enough
        writable = [q for q in cached if q.writable]
        return all(q.broker_name in job.failed_brokers for q in writable)

    def _parse(self, job: _Job, queue: RouteQueue, response: Any, trailing: Any) -> _Sent:
        context = _context(queue, job.address)
        entries = list(response.entries)
        for entry in entries:
            if entry.status.code != pb.OK:
                raise from_status(entry.status, context)
        if not entries and response.status.code != pb.OK:
            raise from_status(response.status, context)
        if len(entries) != len(job.wire):
            raise ClientError(
                f"{context}: {len(entries)} results for {len(job.wire)} messages", "BAD_RESPONSE"
            )
        queue_ids = _stored_queue_ids(trailing, len(entries))
        return _Sent(
            [
                SendReceipt(
                    message_id=str(entry.message_id or sent.system_properties.message_id),
                    topic=job.topic,
                    broker_name=queue.broker_name,
                    queue_id=queue_ids[i],
                    offset=int(entry.offset),
                    transaction_id=str(entry.transaction_id) or None,
                )
                for i, (entry, sent) in enumerate(zip(entries, job.wire, strict=True))
            ],
            queue,
            job.address,
        )

    # -- plumbing ----------------------------------------------------------------------

    def _stub(self, address: str) -> svc_grpc.MessagingServiceStub:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = svc_grpc.MessagingServiceStub(self._channels.get(address))
        return stub

    def _send_metadata(self, queue: RouteQueue) -> tuple[tuple[str, str], ...]:
        return (*self._metadata, (QUEUE_ID_METADATA, str(queue.queue_id)))


def _context(queue: RouteQueue | None, address: str) -> str:
    if queue is None:
        return "SendMessage"
    return f"SendMessage to {queue.broker_name} at {address or queue.address}"


def _stored_queue_ids(trailing: Any, count: int) -> list[int | None]:
    """The queue of each message when the broker said (STORED_QUEUES_METADATA)."""
    for key, value in trailing or ():
        if key == STORED_QUEUES_METADATA:
            parts = str(value).split(",")
            if len(parts) == count and all(p.strip().isdigit() for p in parts):
                return [int(p) for p in parts]
    return [None] * count
