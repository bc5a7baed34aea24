"""capstan.v1.ReplicaPeers, served by every broker: probes and take-backs between the
brokers of a group without a controller (acting_master.py), Escape, where an acting
master of another group stores what it may not store itself (escape.py), and CheckBack,
where the group's master reaches a producer connected to this replica (check_relay.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from capstan.broker.handed_messages import from_handed
from capstan.broker.replication.acting_master import ActingMaster
from capstan.broker.store.message import Message, StoredMessage
from capstan.broker.store.record import CorruptRecord, decode
from capstan.broker.store.status import PutResult
from capstan.broker.store.topic_config import TopicConfig
from capstan.broker.system_topics import HALF_TOPIC
from capstan.common.grpc_abort import abort
from capstan.v1 import replication_pb2 as pb
from capstan.v1 import replication_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class ReplicaPeersService(pb_grpc.ReplicaPeersServicer):
    def __init__(
        self,
        broker_name: str,
        acting: ActingMaster | None,
        max_offset: Callable[[], int],
        is_master: Callable[[], bool],
        topic: Callable[[str], TopicConfig | None],
        put: Callable[[list[Message]], Awaitable[PutResult]],
        check_back: Callable[[StoredMessage, str, str, bool], bool],
    ) -> None:
        """`put` stores what an acting master of another group escapes: a static topic's
        messages in a logic queue this group leads, or not at all. `check_back(half, topic,
        transaction_id, any_producer)` asks a producer connected here."""
        self._name = broker_name
        self._check_back = check_back
        self._acting = acting
        self._max_offset = max_offset
        self._is_master = is_master
        self._topic = topic
        self._put = put

    async def _check_group(self, name: str, context: Any) -> ActingMaster:
        if name != self._name:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this broker serves group {self._name!r}, not {name!r}",
            )
        if self._acting is None:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this broker of {self._name} has no peers (replication.peers, without a "
                "controller)",
            )
        assert self._acting is not None
        return self._acting

    async def Probe(self, request: pb.ProbeRequest, context: Any) -> pb.ProbeReply:
        acting = await self._check_group(request.broker_name, context)
        return acting.probe_reply(self._max_offset())

    async def TakeBack(self, request: pb.TakeBackRequest, context: Any) -> pb.TakeBackReply:
        acting = await self._check_group(request.broker_name, context)
        if acting.is_master:
            await abort(
                context, grpc.StatusCode.FAILED_PRECONDITION, "the master takes back from slaves"
            )
        return await acting.hand_back(request.master_generation)

    async def Escape(self, request: pb.EscapeRequest, context: Any) -> pb.EscapeReply:
        if request.from_broker == self._name:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "escape to a master of another group"
            )
        if not self._is_master():
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this broker of {self._name} is not its master",
            )
        messages = []
        for escaped in request.messages:
            config = self._topic(escaped.topic)
            if config is None or config.write_queue_nums < 1:
                return pb.EscapeReply(
                    status="TOPIC_NOT_EXIST",
                    detail=f"{self._name} has no writable topic {escaped.topic!r}",
                )
            message = from_handed(escaped)
            message.queue_id %= config.write_queue_nums  # a hint: any of this group's queues
            messages.append(message)
        if not messages:
            return pb.EscapeReply(status="PUT_OK")
        result = await self._put(messages)
        if result.status.ok:
            log.info(
                "stored %d message(s) for %s's acting master", len(messages), request.from_broker
            )
        return pb.EscapeReply(status=result.status.name, detail=result.detail)

    async def CheckBack(self, request: pb.CheckBackRequest, context: Any) -> pb.CheckBackReply:
        if request.broker_name != self._name:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"this broker serves group {self._name!r}, not {request.broker_name!r}",
            )
        try:
            half = decode(request.half_record)
        except (CorruptRecord, ValueError, IndexError) as exc:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"half_record is no valid record: {exc}"
            )
        if half.topic != HALF_TOPIC or not request.topic or not request.transaction_id:
            await abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a check-back names a topic, a transaction id and a {HALF_TOPIC} record",
            )
        return pb.CheckBackReply(
            asked=self._check_back(
                half, request.topic, request.transaction_id, request.any_producer
            )
        )
