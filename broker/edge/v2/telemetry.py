"""A client's session: Heartbeat, NotifyClientTermination and Telemetry, the long-lived
stream per client. On Telemetry the client sends its settings, the broker answers with them
merged with its own policy, and keeps the stream to send commands (transaction check-back)
later. Clients are known by the `x-mq-client-id` metadata of their calls."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import grpc
from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.edge.v2.clients import ClientRegistry
from capstan.broker.edge.v2.codes import RequestError, ok
from capstan.broker.store.subscription_groups import SubscriptionGroupStore
from capstan.broker.system_topics import DELAY_LEVELS_MS
from capstan.common.broker_settings import PopSettings

log = logging.getLogger(__name__)

_PRODUCER_ATTEMPTS = 3
_INVALID_SETTINGS = svc.TelemetryCommand()
"""Put in the outbox by the reader: the writer then ends the stream with INVALID_ARGUMENT."""


def _ms(value: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(value)
    return d


def client_id_of(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-mq-client-id":
            return str(value)
    return ""


class SessionHandler:
    def __init__(
        self,
        clients: ClientRegistry,
        groups: SubscriptionGroupStore,
        body_limit: int,
        pop: PopSettings,
    ) -> None:
        """The client's settings are answered from `groups` (retries, FIFO), `body_limit`
        (the largest body, in bytes) and `pop` (batch size and long polling)."""
        self._clients = clients
        self._groups = groups
        self._body_limit = body_limit
        self._pop = pop

    def settings_reply(self, settings: pb.Settings) -> pb.Settings:
        """The client's settings with the broker's policy filled in."""
        reply = pb.Settings()
        reply.CopyFrom(settings)
        if settings.HasField("publishing"):
            reply.publishing.max_body_size = self._body_limit
            reply.publishing.validate_message_type = True
            reply.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=_PRODUCER_ATTEMPTS,
                    exponential_backoff=pb.ExponentialBackoff(
                        initial=_ms(10), max=_ms(1000), multiplier=2.0
                    ),
                )
            )
        elif settings.HasField("subscription"):
            group = self._groups.get(settings.subscription.group.name)
            retries = group.retry_max_times if group is not None else 16
            reply.subscription.fifo = bool(group is not None and group.consume_message_orderly)
            reply.subscription.receive_batch_size = self._pop.max_batch_size
            if not settings.subscription.HasField("long_polling_timeout"):
                reply.subscription.long_polling_timeout.CopyFrom(_ms(self._pop.max_long_polling_ms))
            backoff = [_ms(ms) for ms in DELAY_LEVELS_MS]
            reply.backoff_policy.CopyFrom(
                pb.RetryPolicy(
                    max_attempts=retries + 1,
                    customized_backoff=pb.CustomizedBackoff(next=backoff),
                )
            )
        reply.metric.CopyFrom(pb.Metric(on=False))
        return reply

    async def heartbeat(
        self, request: svc.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> svc.HeartbeatResponse:
        client_id = client_id_of(context)
        if not client_id:
            raise RequestError(pb.CLIENT_ID_REQUIRED, "x-mq-client-id metadata is required")
        self._clients.heartbeat(client_id, request.client_type, request.group.name)
        return svc.HeartbeatResponse(status=ok())

    async def terminate(
        self, request: svc.NotifyClientTerminationRequest, context: grpc.aio.ServicerContext
    ) -> svc.NotifyClientTerminationResponse:
        client_id = client_id_of(context)
        if client_id:
            self._clients.remove(client_id)
        return svc.NotifyClientTerminationResponse(status=ok())

    async def stream(
        self,
        requests: AsyncIterator[svc.TelemetryCommand],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[svc.TelemetryCommand]:
        client_id = client_id_of(context)
        registry = self._clients
        if registry.streams_ended:
            return  # the broker is stopping: the client opens its stream on another one
        session = registry.touch(client_id)
        outbox: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()
        session.stream_opened(outbox)
        reader = asyncio.create_task(self._read(requests, context, client_id, outbox))
        try:
            while True:
                command = await outbox.get()
                if command is None:
                    break
                if command is _INVALID_SETTINGS:
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        "settings carry neither publishing nor subscription",
                    )
                yield command
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            session.stream_closed(outbox)

    async def _read(
        self,
        requests: AsyncIterator[svc.TelemetryCommand],
        context: grpc.aio.ServicerContext,
        client_id: str,
        outbox: asyncio.Queue[svc.TelemetryCommand | None],
    ) -> None:
        try:
            async for command in requests:
                self._clients.touch(client_id)
                if not command.HasField("settings"):
                    continue  # replies to commands we sent; nothing to do with them
                settings = command.settings
                if not settings.HasField("publishing") and not settings.HasField("subscription"):
                    outbox.put_nowait(_INVALID_SETTINGS)
                    return
                self._clients.apply_settings(client_id, settings)
                outbox.put_nowait(
                    svc.TelemetryCommand(status=ok(), settings=self.settings_reply(settings))
                )
        except asyncio.CancelledError:
            raise
        except (grpc.RpcError, OSError, RuntimeError) as exc:  # the client went away
            log.debug("telemetry stream of %s ended: %s", client_id, exc)
        finally:
            outbox.put_nowait(None)
