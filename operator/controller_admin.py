"""The operator's questions to a namespace's controllers about static topics, asked through
the SDK's admin client (any controller replica; a follower passes calls to the leader):
a topic's queue mapping, making one, moving a logic queue, deleting one.

Any failure is a `ClientError` (client/errors.py), which the Topic handler shows in the
status and retries with backoff.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from capstan.client.admin import AdminClient
from capstan.client.errors import NotFound
from capstan.client.queue_mapping_wire import mapping_from_wire
from capstan.common.queue_mapping import QueueMapping
from capstan.operator.topic_sync import TopicShape
from capstan.security.signature import Credentials
from capstan.v1 import admin_pb2 as pb


class ControllerAdmin:
    def __init__(
        self,
        targets: Sequence[str],
        trust: str = "",
        ca_file: Path | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """`targets` are the controller replicas, host:port; over TLS trusting `ca_file`
        and signed with `credentials` when given (`trust` names that bundle)."""
        self.targets = list(targets)
        self.trust = trust
        self._admin = AdminClient(self.targets, retry_s=0, ca_file=ca_file, credentials=credentials)

    async def close(self) -> None:
        await self._admin.close()

    async def mapping(self, topic: str) -> QueueMapping | None:
        """The static topic's mapping; None when there is no such static topic."""
        try:
            reply = await self._admin.get_queue_mapping(topic)
        except NotFound:
            return None
        return mapping_from_wire(reply.mapping)

    async def create_static(
        self, topic: str, queues: int, shape: TopicShape, groups: Sequence[str]
    ) -> QueueMapping:
        wire = pb.Topic(
            name=topic,
            type=shape.message_type,  # the enum by name
            read_queue_nums=queues,
            write_queue_nums=queues,
            perm=shape.perm,
            attributes=dict(shape.attributes),
        )
        reply = await self._admin.create_static_topic(wire, groups)
        return mapping_from_wire(reply.mapping)

    async def remap(self, topic: str, queue: int, group: str) -> QueueMapping:
        reply = await self._admin.remap_static_queue(topic, queue, group)
        return mapping_from_wire(reply.mapping)

    async def retire(self, topic: str, group: str) -> QueueMapping:
        """Take a drained (and deleted) group out of the static topic's mapping."""
        reply = await self._admin.retire_static_group(topic, group)
        return mapping_from_wire(reply.mapping)

    async def delete_topic(self, topic: str) -> bool:
        """Delete the static topic from its groups and the controller's book; False when
        there was none."""
        try:
            reply = await self._admin.delete_topic(topic)
        except NotFound:
            return False
        return bool(reply.deleted)
