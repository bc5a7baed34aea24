"""Transactional messages: a half message, the local transaction, then commit or rollback.

`send_in_transaction` stores the message as a half message (invisible to consumers), runs
the caller's local transaction, and ends the transaction as it decided. When it cannot
decide (UNKNOWN, or the executor raised), or the producer dies before ending it, the broker
asks later: it sends a RecoverOrphanedTransactionCommand over the Telemetry stream this
producer keeps open to each broker it sends half messages to, the `TransactionChecker`
answers, and the producer ends the transaction with source SOURCE_SERVER_CHECK.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Self

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.client import wire
from capstan.client.errors import ClientError, from_exception, from_status
from capstan.client.message import Message, MessageType, MessageView, SendReceipt
from capstan.client.producer import retry
from capstan.client.producer.producer import Producer
from capstan.client.producer.telemetry import TelemetrySession
from capstan.client.route import RouteQueue

log = logging.getLogger(__name__)

SETTINGS_ACK_WAIT_S = 1.0
"""How long the first half message to a broker waits for that broker to acknowledge the
producer's settings (so it can be checked back), in seconds. After that it goes anyway."""


class TransactionResolution(enum.Enum):
    COMMIT = "COMMIT"
    """Make the message visible to consumers."""
    ROLLBACK = "ROLLBACK"
    """Discard it."""
    UNKNOWN = "UNKNOWN"
    """Not decided yet: the broker will ask the TransactionChecker later."""


_V2_RESOLUTIONS = {
    TransactionResolution.COMMIT: pb.COMMIT,
    TransactionResolution.ROLLBACK: pb.ROLLBACK,
}

TransactionChecker = Callable[[MessageView], TransactionResolution]
"""Answers a broker's check-back about an undecided half message."""

LocalTransaction = Callable[[Message, SendReceipt, Any], TransactionResolution]
"""Runs the local transaction of a half message: (message, its receipt, arg) → decision."""


class TransactionProducer(Producer):
    """A Producer that also sends transactional messages.

    `checker` answers check-backs (without one they are ignored and the broker gives up
    after its maximum checks). `topics` are the transactional topics it publishes: at
    `start()` it opens a Telemetry stream to every broker of them, so half messages left
    undecided by an earlier run of this producer are checked back too.
    """

    def __init__(
        self,
        endpoints: list[str] | str,
        *,
        checker: TransactionChecker | None = None,
        topics: Iterable[str] = (),
        send_timeout_s: float = 3.0,
        max_attempts: int = 3,
        route_refresh_s: float = 30.0,
        client_id: str | None = None,
    ) -> None:
        super().__init__(
            endpoints,
            send_timeout_s=send_timeout_s,
            max_attempts=max_attempts,
            route_refresh_s=route_refresh_s,
            client_id=client_id,
        )
        self._checker = checker
        self._topics: frozenset[str] = frozenset(topics)
        """Replaced, never changed in place: other threads read it without a lock."""
        self._sessions: dict[str, TelemetrySession] = {}
        self._sessions_lock = threading.Lock()
        self._check_pool: ThreadPoolExecutor | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> Self:
        super().start()
        if self._check_pool is None:
            self._check_pool = ThreadPoolExecutor(2, thread_name_prefix="capstan-tx-check")
        for topic in sorted(self._topics):
            try:
                queues = self._routes.write_queues(topic)
            except ClientError as exc:
                log.warning("no route to transactional topic %s yet: %s", topic, exc)
                continue
            for address in dict.fromkeys(q.address for q in queues):
                self._session(address)
        return self

    def shutdown(self, timeout_s: float = 5.0) -> None:
        with self._sessions_lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()
        if self._check_pool is not None:
            self._check_pool.shutdown(wait=False, cancel_futures=True)
        super().shutdown(timeout_s)

    # -- sending -----------------------------------------------------------------------

    def send_in_transaction(
        self, message: Message, executor: LocalTransaction, arg: Any = None
    ) -> tuple[SendReceipt, TransactionResolution]:
        """Send `message` as a half message, run `executor(message, receipt, arg)`, and
        commit or roll back as it returns. An exception in the executor counts as UNKNOWN.
        If ending the transaction fails, the broker checks back later."""
        if message.message_type is not MessageType.NORMAL:
            raise ValueError("a transactional message can be neither FIFO nor delayed")
        job = self._job([message], None, transactional=True)
        sent = self._run_sync(job)
        receipt = sent.receipts[0]
        resolution = _run_local(executor, message, receipt, arg)
        if resolution is not TransactionResolution.UNKNOWN and receipt.transaction_id:
            self._end(
                sent.address,
                receipt.topic,
                receipt.message_id,
                receipt.transaction_id,
                resolution,
                pb.SOURCE_CLIENT,
            )
        return receipt, resolution

    def _before_send(self, queue: RouteQueue, message_type: MessageType) -> None:
        if message_type is not MessageType.TRANSACTION:
            return
        if queue.topic not in self._topics:
            self._topics = self._topics | {queue.topic}
            with self._sessions_lock:
                sessions = list(self._sessions.values())
            for s in sessions:
                s.push_settings()
        self._session(queue.address).wait_ready(SETTINGS_ACK_WAIT_S)

    def _end(
        self,
        address: str,
        topic: str,
        message_id: str,
        transaction_id: str,
        resolution: TransactionResolution,
        source: int,
    ) -> bool:
        """EndTransaction at the broker holding the half message, retried there on
        retriable failures; whether it was done. A failure is logged, not raised: the
        broker will check back."""
        request = svc.EndTransactionRequest(
            topic=pb.Resource(name=topic),
            message_id=message_id,
            transaction_id=transaction_id,
            resolution=_V2_RESOLUTIONS[resolution],
            source=source,
        )
        context = f"EndTransaction {resolution.value} of {message_id} at {address}"
        for attempt in range(1, self.max_attempts + 1):
            try:
                response = self._stub(address).EndTransaction(
                    request, timeout=self.send_timeout_s, metadata=self._metadata
                )
            except (grpc.RpcError, ValueError, RuntimeError) as exc:
                error = from_exception(exc, context)
            else:
                if response.status.code == pb.OK:
                    return True
                error = from_status(response.status, context)
            if not error.retriable or attempt == self.max_attempts:
                break
            time.sleep(retry.backoff_s(attempt, same_broker=True))
        log.warning("%s; the broker will check back", error)
        return False

    # -- check-back --------------------------------------------------------------------

    def _settings(self) -> pb.Settings:
        return pb.Settings(
            client_type=pb.PRODUCER,
            access_point=wire.endpoints(self.endpoints[0]),
            request_timeout=wire.duration(self.send_timeout_s),
            publishing=pb.Publishing(topics=[pb.Resource(name=t) for t in sorted(self._topics)]),
            user_agent=wire.user_agent(),
        )

    def _session(self, address: str) -> TelemetrySession:
        with self._sessions_lock:
            session = self._sessions.get(address)
            if session is None:
                session = TelemetrySession(
                    address, self._channels, self._metadata, self._settings, self._on_command
                )
                self._sessions[address] = session.start()
            return session

    def _on_command(self, address: str, command: svc.TelemetryCommand) -> None:
        if not command.HasField("recover_orphaned_transaction_command"):
            return
        pool = self._check_pool
        if pool is None:
            return
        try:
            pool.submit(self._answer_check, address, command.recover_orphaned_transaction_command)
        except RuntimeError:  # shutting down; the broker will ask again
            pass

    def _answer_check(self, address: str, check: svc.RecoverOrphanedTransactionCommand) -> None:
        view = wire.to_view(check.message)
        if self._checker is None:
            log.warning("broker %s asks about transaction %s; no checker", address, view.message_id)
            return
        try:
            resolution: object = self._checker(view)
        except Exception:
            log.exception("transaction checker failed on %s; the broker will ask again", view)
            return
        if not isinstance(resolution, TransactionResolution):
            log.warning("transaction checker returned %r, not a resolution", resolution)
            return
        if resolution is not TransactionResolution.UNKNOWN:
            self._end(
                address,
                view.topic,
                view.message_id,
                str(check.transaction_id),
                resolution,
                pb.SOURCE_SERVER_CHECK,
            )


def _run_local(
    executor: LocalTransaction, message: Message, receipt: SendReceipt, arg: Any
) -> TransactionResolution:
    try:
        resolution: object = executor(message, receipt, arg)
    except Exception:
        log.exception("local transaction of %s failed; leaving it UNKNOWN", receipt.message_id)
        return TransactionResolution.UNKNOWN
    if not isinstance(resolution, TransactionResolution):
        log.warning("local transaction returned %r, not a resolution: UNKNOWN", resolution)
        return TransactionResolution.UNKNOWN
    return resolution
