"""The operator's questions to one broker group, in its own words (a topic's shape, the
committed offsets, the backlog), asked through the SDK's admin client on the group's Service.

Reads give the pure decision modules their inputs (topic_sync.py, scaling.py); writes
carry out their steps. Any failure is a `ClientError` (client/errors.py); the handlers turn
it into a temporary error with backoff, shown in the status. Kopf retries the handler, so
a call here is tried once.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from capstan.client.admin import AdminClient
from capstan.client.errors import AlreadyExists, NotFound
from capstan.operator.scaling import Backlog
from capstan.operator.topic_sync import TopicShape
from capstan.security.signature import Credentials
from capstan.v1 import admin_pb2 as pb


class BrokerGroupAdmin:
    def __init__(
        self,
        target: str,
        trust: str = "",
        ca_file: Path | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        """`target` is a broker of the group, host:port; over TLS trusting `ca_file` and
        signed with `credentials` when given (`trust` names that bundle)."""
        self.target = target
        self.trust = trust
        self._admin = AdminClient(target, retry_s=0, ca_file=ca_file, credentials=credentials)

    async def close(self) -> None:
        await self._admin.close()

    async def topic(self, name: str) -> tuple[TopicShape, dict[int, int]] | None:
        """The topic's settings and each queue's end offset, None when the group lacks it."""
        try:
            reply = await self._admin.describe_topic(name)
        except NotFound:
            return None
        t = reply.topic.topic
        shape = TopicShape(
            t.read_queue_nums,
            t.write_queue_nums,
            t.perm,
            pb.TopicType.Name(t.type),
            dict(t.attributes),
        )
        return shape, {q.queue_id: q.max_offset for q in reply.topic.queues}

    async def committed(self, topic: str) -> dict[str, dict[int, int]]:
        """Per consumer group that committed on `topic`: queue id -> committed offset."""
        reply = await self._admin.list_groups()
        out: dict[str, dict[int, int]] = {}
        for group in reply.groups:
            for o in group.offsets:
                if o.topic == topic:
                    out.setdefault(group.group.name, {})[o.queue_id] = o.committed_offset
        return out

    async def put_topic(self, name: str, shape: TopicShape, create: bool) -> None:
        topic = pb.Topic(
            name=name,
            type=shape.message_type,  # the enum by name
            read_queue_nums=shape.read_queues,
            write_queue_nums=shape.write_queues,
            perm=shape.perm,
            attributes=dict(shape.attributes),
        )
        if create:
            await self._admin.create_topic(topic)
        else:
            await self._admin.update_topic(topic)

    async def delete_topic(self, name: str) -> bool:
        """Delete the topic; False when the group did not have it."""
        try:
            reply = await self._admin.delete_topic(name)
        except NotFound:
            return False
        return bool(reply.deleted)

    async def delete_group(self, name: str) -> bool:
        """Delete the consumer group; False when the group did not have it."""
        try:
            reply = await self._admin.delete_group(name)
        except NotFound:
            return False
        return bool(reply.deleted)

    async def backlog(self) -> Backlog:
        reply = await self._admin.describe_broker()
        return Backlog(reply.unconsumed, reply.half_messages, reply.timers_waiting)

    async def put_group(
        self, name: str, fifo: bool, max_attempts: int, create: bool
    ) -> dict[str, int]:
        """Create or update the group; its lag per topic."""
        group = pb.Group(name=name, fifo=fifo, max_attempts=max_attempts, consume_enable=True)
        try:
            if create:
                reply = await self._admin.create_group(group)
            else:
                reply = await self._admin.update_group(group)
        except AlreadyExists:
            if not create:
                raise
            return await self.put_group(name, fifo, max_attempts, create=False)
        return lag_by_topic(reply.group.offsets)

    async def user(self, name: str) -> pb.User | None:
        """The user as the group holds it (never its secret key); None when it has none."""
        try:
            reply = await self._admin.get_user(name)
        except NotFound:
            return None
        user: pb.User = reply.user
        return user

    async def put_user(self, request: pb.User, create: bool) -> None:
        """CreateUser, or UpdateUser (the request says whether the policy is replaced)."""
        if create:
            await self._admin.create_user(request)
        else:
            await self._admin.update_user(request)

    async def delete_user(self, name: str) -> bool:
        """Delete the user; False when the group did not have it."""
        try:
            await self._admin.delete_user(name)
        except NotFound:
            return False
        return True


def lag_by_topic(offsets: Iterable[pb.GroupQueueOffset]) -> dict[str, int]:
    """A group's lag, summed over each topic's queues (retry topics included)."""
    lag: dict[str, int] = {}
    for o in offsets:
        lag[o.topic] = lag.get(o.topic, 0) + max(0, o.lag)
    return lag
