"""The consumer's calls to brokers: capstan.v1.Consumer and capstan.v1.Pull, by address.

Every failure comes out as a `ClientError` (see capstan.client.errors), so the services
above decide on retriable versus refused without knowing about gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import grpc

from capstan.client.channels import ChannelPool, call_metadata
from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.errors import from_exception
from capstan.v1 import consumer_pb2 as c
from capstan.v1 import consumer_pb2_grpc as c_grpc
from capstan.v1 import pull_pb2 as p
from capstan.v1 import pull_pb2_grpc as p_grpc

CALL_TIMEOUT_S = 5.0
"""Deadline of the short calls (heartbeat, lock, offsets, send-back), in seconds."""
PULL_MARGIN_S = 5.0
"""A pull's deadline is its long-polling time plus this, in seconds."""

R = TypeVar("R")


def _refs(queues: Iterable[MessageQueue]) -> list[c.QueueRef]:
    return [c.QueueRef(topic=q.topic, queue_id=q.queue_id) for q in queues]


class BrokerCalls:
    def __init__(self, channels: ChannelPool, client_id: str, group: str) -> None:
        self._channels = channels
        self._metadata = call_metadata(client_id)
        self.client_id = client_id
        self.group = group
        # Stubs are cached per address: making one builds a callable per RPC.
        self._consumer_stubs: dict[str, c_grpc.ConsumerStub] = {}
        self._pull_stubs: dict[str, p_grpc.PullStub] = {}

    def _consumer(self, address: str) -> c_grpc.ConsumerStub:
        stub = self._consumer_stubs.get(address)
        if stub is None:
            channel = self._channels.get(address)
            stub = self._consumer_stubs[address] = c_grpc.ConsumerStub(channel)  # type: ignore[no-untyped-call]
        return stub

    def _call(self, what: str, address: str, call: Callable[[], R]) -> R:
        try:
            return call()
        except Exception as exc:
            raise from_exception(exc, f"{what} at {address}") from exc

    # -- membership --------------------------------------------------------------------

    def heartbeat(
        self,
        address: str,
        message_model: int,
        consume_type: int,
        orderly: bool,
        subscriptions: dict[str, str],
        owned: Iterable[MessageQueue] = (),
    ) -> int:
        request = c.HeartbeatRequest(
            client_id=self.client_id,
            group=self.group,
            message_model=message_model,  # type: ignore[arg-type]
            consume_type=consume_type,  # type: ignore[arg-type]
            orderly=orderly,
            subscriptions=[c.Subscription(topic=t, expression=e) for t, e in subscriptions.items()],
            owned=[
                c.QueueRef(topic=q.topic, broker_name=q.broker_name, queue_id=q.queue_id)
                for q in owned
            ],
        )
        stub = self._consumer(address)
        reply = self._call(
            "heartbeat",
            address,
            lambda: stub.Heartbeat(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )
        return int(reply.members_version)

    def watch(self, address: str) -> Any:
        """The WatchGroup call: iterate it for member lists; `.cancel()` ends it."""
        request = c.WatchGroupRequest(client_id=self.client_id, group=self.group)
        return self._consumer(address).WatchGroup(request, metadata=self._metadata)

    def members(self, address: str) -> list[c.Member]:
        stub = self._consumer(address)
        reply = self._call(
            "member list",
            address,
            lambda: stub.GetMembers(
                c.GetMembersRequest(group=self.group),
                timeout=CALL_TIMEOUT_S,
                metadata=self._metadata,
            ),
        )
        return list(reply.members)

    def unregister(self, address: str) -> None:
        stub = self._consumer(address)
        request = c.UnregisterRequest(client_id=self.client_id, group=self.group)
        self._call(
            "unregister",
            address,
            lambda: stub.Unregister(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )

    # -- queue locks -------------------------------------------------------------------

    def lock(self, address: str, queues: list[MessageQueue]) -> tuple[set[tuple[str, int]], float]:
        """Lock or renew: the (topic, queue id) pairs this client holds now, and how long
        the broker keeps a lock not renewed, in seconds (0: it did not say)."""
        request = c.LockQueuesRequest(
            client_id=self.client_id, group=self.group, queues=_refs(queues)
        )
        stub = self._consumer(address)
        reply = self._call(
            "lock",
            address,
            lambda: stub.LockQueues(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )
        return {(r.topic, r.queue_id) for r in reply.locked}, reply.expiry_ms / 1000

    def unlock(self, address: str, queues: list[MessageQueue]) -> None:
        request = c.UnlockQueuesRequest(
            client_id=self.client_id, group=self.group, queues=_refs(queues)
        )
        stub = self._consumer(address)
        self._call(
            "unlock",
            address,
            lambda: stub.UnlockQueues(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )

    # -- offsets -----------------------------------------------------------------------

    def commit_offsets(self, address: str, offsets: dict[MessageQueue, int]) -> None:
        request = c.CommitOffsetsRequest(
            group=self.group,
            offsets=[
                c.QueueOffset(topic=q.topic, queue_id=q.queue_id, offset=o)
                for q, o in offsets.items()
            ],
        )
        stub = self._consumer(address)
        self._call(
            "offset commit",
            address,
            lambda: stub.CommitOffsets(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )

    def query_offset(self, address: str, queue: MessageQueue) -> int:
        """The group's committed offset of the queue, or -1 when it has none."""
        request = c.QueryOffsetRequest(group=self.group, topic=queue.topic, queue_id=queue.queue_id)
        stub = self._consumer(address)
        reply = self._call(
            "offset query",
            address,
            lambda: stub.QueryOffset(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )
        return int(reply.offset) if reply.found else -1

    def search_offset(self, address: str, queue: MessageQueue, timestamp_ms: int) -> int:
        request = c.SearchOffsetRequest(
            topic=queue.topic, queue_id=queue.queue_id, timestamp_ms=timestamp_ms
        )
        stub = self._consumer(address)
        reply = self._call(
            "offset search",
            address,
            lambda: stub.SearchOffset(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )
        return int(reply.offset)

    def queue_bounds(self, address: str, queue: MessageQueue) -> tuple[int, int]:
        request = c.GetQueueBoundsRequest(topic=queue.topic, queue_id=queue.queue_id)
        stub = self._consumer(address)
        reply = self._call(
            "queue bounds",
            address,
            lambda: stub.GetQueueBounds(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )
        return int(reply.min_offset), int(reply.max_offset)

    # -- retry -------------------------------------------------------------------------

    def send_back(
        self, address: str, commit_log_offset: int, delay_level: int, max_reconsume_times: int
    ) -> c.SendBackReply:
        request = c.SendBackRequest(
            group=self.group,
            commit_log_offset=commit_log_offset,
            delay_level=delay_level,
            max_reconsume_times=max_reconsume_times,
        )
        stub = self._consumer(address)
        reply: c.SendBackReply = self._call(
            "send-back",
            address,
            lambda: stub.SendBack(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata),
        )
        return reply

    # -- pull --------------------------------------------------------------------------

    def pull_future(
        self,
        address: str,
        queue: MessageQueue,
        offset: int,
        max_messages: int,
        expression: str,
        long_polling_ms: int,
    ) -> Any:
        """Start a pull; a grpc future (add_done_callback / result())."""
        request = p.PullMessagesRequest(
            group=self.group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            offset=offset,
            max_messages=max_messages,
            tag_expression=expression,
            long_polling_ms=long_polling_ms,
        )
        stub = self._pull_stubs.get(address)
        if stub is None:
            channel = self._channels.get(address)
            stub = self._pull_stubs[address] = p_grpc.PullStub(channel)  # type: ignore[no-untyped-call]
        return stub.PullMessages.future(
            request, timeout=long_polling_ms / 1000 + PULL_MARGIN_S, metadata=self._metadata
        )


def iterate_watch(call: Any) -> Iterator[c.GroupMembers]:
    """The member lists of a watch call until it ends; a broken stream just ends."""
    try:
        yield from call
    except grpc.RpcError:
        return
