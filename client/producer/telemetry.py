"""A Telemetry stream to one broker, kept open for as long as the client runs.

The stream is how a broker knows a producer (the client's Settings go first) and how it
reaches it later: a transaction check-back arrives as a RecoverOrphanedTransactionCommand
on it. A stream that drops (the broker restarted, the connection broke) is opened again
after a pause, settings first, for as long as the session is not closed.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.client.channels import ChannelPool

log = logging.getLogger(__name__)

RECONNECT_S = 1.0
"""Pause before a dropped stream is opened again, in seconds."""

CommandHandler = Callable[[str, svc.TelemetryCommand], None]
"""(broker address, command) for each command the broker sends other than settings."""


def _drain(outbox: queue.Queue[svc.TelemetryCommand | None]) -> Iterator[svc.TelemetryCommand]:
    """The request side of a stream: what is put in the outbox, until None."""
    while True:
        command = outbox.get()
        if command is None:
            return
        yield command


class TelemetrySession:
    """One broker's stream; thread-safe. `start()` opens it on a daemon thread."""

    def __init__(
        self,
        address: str,
        channels: ChannelPool,
        metadata: tuple[tuple[str, str], ...],
        settings: Callable[[], pb.Settings],
        on_command: CommandHandler,
        reconnect_s: float = RECONNECT_S,
    ) -> None:
        self.address = address
        self._channels = channels
        self._metadata = metadata
        self._settings = settings
        self._on_command = on_command
        self._reconnect_s = reconnect_s
        self._lock = threading.Lock()
        self._outbox: queue.Queue[svc.TelemetryCommand | None] | None = None
        self._call: grpc.Call | None = None
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._stream_routine, name=f"capstan-telemetry-{address}", daemon=True
        )

    def start(self) -> TelemetrySession:
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether the broker has acknowledged our settings on the current stream."""
        return self._ready.wait(timeout_s)

    def push_settings(self) -> None:
        """Send the current settings again (e.g. the producer publishes a new topic)."""
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(svc.TelemetryCommand(settings=self._settings()))

    def close(self, timeout_s: float = 2.0) -> None:
        self._closing.set()
        with self._lock:
            outbox, call = self._outbox, self._call
        if outbox is not None:
            outbox.put(None)
        if call is not None:
            call.cancel()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _stream_routine(self) -> None:
        while not self._closing.is_set():
            try:
                self._run_stream()
            except grpc.RpcError as exc:
                if not self._closing.is_set():
                    log.info("telemetry stream to %s dropped (%s); reopening", self.address, exc)
            except (ValueError, RuntimeError):  # the channel (pool) is closed: we are done
                return
            self._closing.wait(self._reconnect_s)

    def _run_stream(self) -> None:
        outbox: queue.Queue[svc.TelemetryCommand | None] = queue.Queue()
        outbox.put(svc.TelemetryCommand(settings=self._settings()))
        stub = svc_grpc.MessagingServiceStub(self._channels.get(self.address))
        # wait_for_ready: a broker that is restarting gets the stream the moment it is
        # back, rather than after the channel's reconnect backoff.
        call = stub.Telemetry(_drain(outbox), metadata=self._metadata, wait_for_ready=True)
        with self._lock:
            self._outbox, self._call = outbox, call
        try:
            if self._closing.is_set():
                call.cancel()  # close() ran before the call was recorded
            for command in call:
                self._handle(command)
        finally:
            self._ready.clear()
            outbox.put(None)  # ends the request iterator if gRPC is still reading it
            with self._lock:
                self._outbox, self._call = None, None

    def _handle(self, command: svc.TelemetryCommand) -> None:
        kind = command.WhichOneof("command")
        if kind == "settings":
            self._ready.set()
        elif kind is not None:
            self._on_command(self.address, command)
