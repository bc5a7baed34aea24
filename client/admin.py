"""capstan.v1 Admin and Controller for every caller outside the servers: the operator, the
Spark jobs, the CLI, `capstan up` and the benchmarks; and capstan.v1 Pull of one replica,
for the Spark data source (`BlockingPullClient`).

`AdminClient` and `ControllerClient` are for asyncio; `BlockingAdminClient` and
`BlockingControllerClient` are their twins for threads (Spark executors, the CLI). Each
owns its channels and decides, in one place, what every call gets:

- a deadline (`timeout_s`, per call) and, should the channel never complete a call, a
  cancellation a little after it, with a fresh channel for the next one (a replaced pod
  keeps its name, not its address);
- retries of what did not reach the server (UNAVAILABLE) within `retry_s`;
- the caller's metadata (`metadata`, on every call; `call(..., metadata=)` adds to it),
  signed afresh per call with `credentials` when given (a broker with authentication on
  refuses unsigned calls); over TLS trusting the CA in `ca_file` when given;
- an answer that is not OK raised as a typed `ClientError` (client/errors.py): NotFound,
  AlreadyExists, NotReady (FAILED_PRECONDITION), TransportError, BrokerBusy, RequestRefused.

A controller client takes every controller's address and follows the leader: a follower
refuses with FAILED_PRECONDITION, and the call goes on to the next address; the one that
answered is asked first next time.

The typed methods take what a caller has (a name, or the request message where it has
many fields) and return the reply message; `call(method, request)` reaches any RPC.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import grpc

from capstan.client.errors import ClientError, NotReady, from_admin_rpc_error
from capstan.common.channel_pool import CHANNEL_OPTIONS
from capstan.security.signature import Credentials, signed_metadata
from capstan.security.tls import channel_credentials
from capstan.v1 import admin_pb2 as apb
from capstan.v1 import admin_pb2_grpc as apb_grpc
from capstan.v1 import controller_pb2 as cpb
from capstan.v1 import controller_pb2_grpc as cpb_grpc
from capstan.v1 import pull_pb2 as ppb
from capstan.v1 import pull_pb2_grpc as ppb_grpc

DEFAULT_TIMEOUT_S = 10.0
"""Each call's deadline unless the client or the call says otherwise, in seconds."""

RETRY_WINDOW_S = 3.0
"""How long a call that did not reach the server (UNAVAILABLE) is tried again, in seconds."""

RETRY_PAUSE_S = 0.2

UNANSWERED_GRACE_S = 5.0
"""How long past its deadline a call may stay open before it is cancelled, in seconds."""

Metadata = Sequence[tuple[str, str]]
R = TypeVar("R")


def _worth_retrying(error: ClientError) -> bool:
    return error.code == "UNAVAILABLE"


def _follow_on(error: ClientError) -> bool:
    """Whether a controller call should go on to the next controller's address."""
    return isinstance(error, NotReady) or error.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")


def _from_leader(status: Any) -> bool:
    return bool(status.leader)


class _AdminCalls(Generic[R]):
    """The Admin RPCs by name; `call` makes each (R: the reply, or an awaitable of it)."""

    def call(
        self,
        method: str,
        request: Any,
        what: str = "",
        *,
        metadata: Metadata = (),
        timeout_s: float | None = None,
        prefer: Callable[[Any], bool] | None = None,
    ) -> R:
        raise NotImplementedError

    def create_topic(self, topic: apb.Topic) -> R:
        return self.call("CreateTopic", topic, f"creating topic {topic.name}")

    def update_topic(self, topic: apb.Topic) -> R:
        return self.call("UpdateTopic", topic, f"updating topic {topic.name}")

    def delete_topic(self, name: str) -> R:
        return self.call("DeleteTopic", apb.TopicRequest(name=name), f"deleting topic {name}")

    def describe_topic(self, name: str) -> R:
        return self.call("DescribeTopic", apb.TopicRequest(name=name), f"describing topic {name}")

    def list_topics(self, request: apb.ListTopicsRequest | None = None) -> R:
        return self.call("ListTopics", request or apb.ListTopicsRequest(), "listing topics")

    def create_static_topic(self, topic: apb.Topic, groups: Sequence[str] = ()) -> R:
        request = apb.StaticTopicRequest(topic=topic, groups=groups)
        return self.call("CreateStaticTopic", request, f"creating static topic {topic.name}")

    def remap_static_queue(self, topic: str, queue_id: int, group: str) -> R:
        request = apb.RemapRequest(topic=topic, queue_id=queue_id, group=group)
        return self.call(
            "RemapStaticQueue", request, f"moving queue {queue_id} of {topic} to {group}"
        )

    def retire_static_group(self, topic: str, group: str) -> R:
        request = apb.RemapRequest(topic=topic, group=group)
        return self.call(
            "RetireStaticGroup", request, f"retiring group {group} from static topic {topic}"
        )

    def get_queue_mapping(self, topic: str) -> R:
        request = apb.QueueMappingRequest(topic=topic)
        return self.call("GetQueueMapping", request, f"reading the queue mapping of {topic}")

    def create_group(self, group: apb.Group) -> R:
        return self.call("CreateGroup", group, f"creating group {group.name}")

    def update_group(self, group: apb.Group) -> R:
        return self.call("UpdateGroup", group, f"updating group {group.name}")

    def delete_group(self, name: str) -> R:
        return self.call("DeleteGroup", apb.GroupRequest(name=name), f"deleting group {name}")

    def describe_group(self, name: str) -> R:
        return self.call("DescribeGroup", apb.GroupRequest(name=name), f"describing group {name}")

    def list_groups(self, request: apb.ListGroupsRequest | None = None) -> R:
        return self.call("ListGroups", request or apb.ListGroupsRequest(), "listing groups")

    def reset_offset(self, request: apb.ResetOffsetRequest) -> R:
        what = f"resetting the offsets of {request.group} on {request.topic}"
        return self.call("ResetOffset", request, what)

    def get_message(self, request: apb.GetMessageRequest) -> R:
        return self.call("GetMessage", request, "looking the message up")

    def describe_broker(self) -> R:
        return self.call("DescribeBroker", apb.DescribeBrokerRequest(), "describing the broker")

    def create_user(self, user: apb.User) -> R:
        return self.call("CreateUser", user, f"creating user {user.username!r}")

    def update_user(self, user: apb.User) -> R:
        return self.call("UpdateUser", user, f"updating user {user.username!r}")

    def delete_user(self, name: str) -> R:
        return self.call("DeleteUser", apb.UserRequest(username=name), f"deleting user {name!r}")

    def get_user(self, name: str) -> R:
        return self.call("GetUser", apb.UserRequest(username=name), f"reading user {name!r}")

    def list_users(self) -> R:
        return self.call("ListUsers", apb.ListUsersRequest(), "listing users")

    def create_acl(self, name: str, entry: apb.PolicyEntry) -> R:
        request = apb.AclRequest(username=name, entry=entry)
        return self.call("CreateAcl", request, f"adding to the ACL of {name!r}")

    def delete_acl(self, name: str, resources: Sequence[str] = ()) -> R:
        request = apb.DeleteAclRequest(username=name, resources=list(resources))
        return self.call("DeleteAcl", request, f"taking from the ACL of {name!r}")


class _ControllerCalls(Generic[R]):
    """The Controller RPCs that callers outside the brokers make."""

    def call(
        self,
        method: str,
        request: Any,
        what: str = "",
        *,
        metadata: Metadata = (),
        timeout_s: float | None = None,
        prefer: Callable[[Any], bool] | None = None,
    ) -> R:
        raise NotImplementedError

    def replica_info(self, group: str) -> R:
        request = cpb.GetReplicaInfoRequest(group=group)
        return self.call("GetReplicaInfo", request, f"reading group {group} from the controller")

    def elect_master(self, group: str, broker_id: int) -> R:
        request = cpb.ElectMasterRequest(group=group, preferred_broker_id=broker_id)
        return self.call("ElectMaster", request, f"moving the master of {group}")

    def cluster_status(self) -> R:
        """From the leader when one of the addresses leads: a follower's status shows every
        broker as not alive (only the leader hears heartbeats)."""
        request = cpb.GetClusterStatusRequest()
        return self.call(
            "GetClusterStatus", request, "reading the cluster's status", prefer=_from_leader
        )


class _Addresses:
    """What both kinds of caller share: the addresses in the order to try them (the one
    that answered last first), the call's deadline and metadata, and when to give up."""

    def __init__(
        self,
        targets: str | Sequence[str],
        timeout_s: float,
        retry_s: float,
        metadata: Metadata,
        credentials: Credentials | None,
        ca_file: str | Path | None,
    ) -> None:
        addresses = [targets] if isinstance(targets, str) else list(targets)
        if not addresses:
            raise ValueError("no address to call")
        self.targets = addresses
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.metadata = tuple(metadata)
        self.credentials = credentials
        self.tls = channel_credentials(Path(ca_file)) if ca_file else None
        """TLS trusting the CA in `ca_file`; None: plaintext."""
        self._first = 0  # plain int: one store, safe between threads

    def order(self) -> list[int]:
        first, n = self._first, len(self.targets)
        return [(first + step) % n for step in range(n)]

    def answered(self, index: int) -> None:
        self._first = index

    def plan(self, metadata: Metadata, timeout_s: float | None) -> tuple[float, Metadata, float]:
        """The call's deadline, its metadata and when its retries end (monotonic)."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        signed = signed_metadata(self.credentials) if self.credentials is not None else ()
        return timeout, (*self.metadata, *metadata, *signed), time.monotonic() + self.retry_s

    def settles(self, reply: Any, prefer: Callable[[Any], bool] | None) -> bool:
        """Whether `reply` ends the call: wanted, or with no other address to ask."""
        return prefer is None or len(self.targets) == 1 or prefer(reply)

    def goes_on(self, error: ClientError) -> bool:
        """Whether a failed call is tried at the next address."""
        return len(self.targets) > 1 and _follow_on(error)

    @staticmethod
    def raise_unless_retrying(error: ClientError | None, retry_until: float) -> None:
        assert error is not None
        if not _worth_retrying(error) or time.monotonic() >= retry_until:
            raise error


# -- asyncio ---------------------------------------------------------------------------------


class _AsyncChannel:
    """One aio channel to one address, replaced when a call on it goes unanswered or finds
    nothing serving there (so a name is resolved afresh: a replaced pod keeps its name, not
    its address). A replaced channel is closed once the calls still running on it end, so
    one caller's failure never cancels another's call."""

    def __init__(self, target: str, stub_class: type, tls: grpc.ChannelCredentials | None) -> None:
        self.target = target
        self._stub_class = stub_class
        self._tls = tls
        self._channel = self._open()
        self.stub = stub_class(self._channel)
        self._running: dict[grpc.aio.Channel, int] = {}
        self._closing: set[asyncio.Future[None]] = set()

    def reopen(self, failed: grpc.aio.Channel | None = None) -> None:
        """Replace the channel (unless `failed` names one already replaced)."""
        old = self._channel
        if failed is not None and failed is not old:
            return
        self._channel = self._open()
        self.stub = self._stub_class(self._channel)
        if not self._running.get(old):
            self._close_later(old)

    def _open(self) -> grpc.aio.Channel:
        if self._tls is None:
            return grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(self.target, self._tls, options=CHANNEL_OPTIONS)

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        closing = asyncio.ensure_future(channel.close())
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        await self._channel.close()
        await asyncio.gather(*self._closing, return_exceptions=True)

    async def once(self, method: str, request: Any, metadata: Metadata, timeout_s: float) -> Any:
        """One call; a call the channel has not completed a while after its deadline is
        cancelled and raised as DEADLINE_EXCEEDED, and the channel is replaced."""
        channel = self._channel
        self._running[channel] = self._running.get(channel, 0) + 1
        try:
            call = getattr(self.stub, method)(request, timeout=timeout_s, metadata=tuple(metadata))
            pending = asyncio.ensure_future(call)
            done, _ = await asyncio.wait({pending}, timeout=timeout_s + UNANSWERED_GRACE_S)
            if not done:
                call.cancel()
                pending.cancel()
                self.reopen(channel)
                raise _unanswered(timeout_s + UNANSWERED_GRACE_S)
            try:
                return pending.result()
            except grpc.RpcError as exc:
                if (
                    isinstance(exc, grpc.aio.AioRpcError)
                    and exc.code() is grpc.StatusCode.UNAVAILABLE
                ):
                    self.reopen(channel)  # re-resolves the name at once
                raise
        finally:
            left = self._running[channel] - 1
            if left:
                self._running[channel] = left
            else:
                del self._running[channel]
                if channel is not self._channel:
                    self._close_later(channel)


def _unanswered(seconds: float) -> grpc.RpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        f"no answer within {seconds:.0f} s",
    )


class _AsyncCaller(_Addresses):
    def __init__(
        self,
        targets: str | Sequence[str],
        stub_class: type,
        timeout_s: float,
        retry_s: float,
        metadata: Metadata,
        credentials: Credentials | None,
        ca_file: str | Path | None,
    ) -> None:
        super().__init__(targets, timeout_s, retry_s, metadata, credentials, ca_file)
        self._channels = [_AsyncChannel(a, stub_class, self.tls) for a in self.targets]

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def __aenter__(self: Any) -> Any:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(
        self,
        method: str,
        request: Any,
        what: str = "",
        *,
        metadata: Metadata = (),
        timeout_s: float | None = None,
        prefer: Callable[[Any], bool] | None = None,
    ) -> Any:
        """`prefer`: a reply it rejects is taken only when no other address gives one it
        accepts (a follower controller's status, when the leader may answer)."""
        timeout, sent, retry_until = self.plan(metadata, timeout_s)
        while True:
            error: ClientError | None = None
            second_best: Any = None
            for index in self.order():
                try:
                    reply = await self._channels[index].once(method, request, sent, timeout)
                except grpc.RpcError as exc:
                    error = from_admin_rpc_error(exc, what or method)
                    if self.goes_on(error):
                        continue
                    break
                if not self.settles(reply, prefer):
                    second_best = reply
                    continue
                self.answered(index)
                return reply
            if second_best is not None:
                return second_best
            self.raise_unless_retrying(error, retry_until)
            await asyncio.sleep(RETRY_PAUSE_S)


class AdminClient(_AsyncCaller, _AdminCalls[Awaitable[Any]]):
    """capstan.v1 Admin at `target` (a broker, a group's Service, or the controller, which
    passes each call to every broker group; several controller replicas may be named, the
    one that answers is asked first next time), for asyncio."""

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_s: float = RETRY_WINDOW_S,
        metadata: Metadata = (),
        credentials: Credentials | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        super().__init__(
            target, apb_grpc.AdminStub, timeout_s, retry_s, metadata, credentials, ca_file
        )


class ControllerClient(_AsyncCaller, _ControllerCalls[Awaitable[Any]]):
    """capstan.v1 Controller at any of `targets`, following the leader, for asyncio."""

    def __init__(
        self,
        targets: str | Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_s: float = RETRY_WINDOW_S,
        metadata: Metadata = (),
        credentials: Credentials | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        super().__init__(
            targets, cpb_grpc.ControllerStub, timeout_s, retry_s, metadata, credentials, ca_file
        )


# -- threads ---------------------------------------------------------------------------------


class _BlockingCaller(_Addresses):
    def __init__(
        self,
        targets: str | Sequence[str],
        stub_class: type,
        timeout_s: float,
        retry_s: float,
        metadata: Metadata,
        credentials: Credentials | None,
        ca_file: str | Path | None,
    ) -> None:
        super().__init__(targets, timeout_s, retry_s, metadata, credentials, ca_file)
        self._channels = [
            grpc.secure_channel(a, self.tls, options=CHANNEL_OPTIONS)
            if self.tls is not None
            else grpc.insecure_channel(a, options=CHANNEL_OPTIONS)
            for a in self.targets
        ]
        self._stubs = [stub_class(c) for c in self._channels]

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    def __enter__(self: Any) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        request: Any,
        what: str = "",
        *,
        metadata: Metadata = (),
        timeout_s: float | None = None,
        prefer: Callable[[Any], bool] | None = None,
    ) -> Any:
        """`prefer`: a reply it rejects is taken only when no other address gives one it
        accepts (a follower controller's status, when the leader may answer)."""
        timeout, sent, retry_until = self.plan(metadata, timeout_s)
        while True:
            error: ClientError | None = None
            second_best: Any = None
            for index in self.order():
                rpc = getattr(self._stubs[index], method)
                try:
                    reply = rpc(request, timeout=timeout, metadata=sent)
                except grpc.RpcError as exc:
                    error = from_admin_rpc_error(exc, what or method)
                    if self.goes_on(error):
                        continue
                    break
                if not self.settles(reply, prefer):
                    second_best = reply
                    continue
                self.answered(index)
                return reply
            if second_best is not None:
                return second_best
            self.raise_unless_retrying(error, retry_until)
            time.sleep(RETRY_PAUSE_S)

    def stream(
        self,
        method: str,
        requests: Iterable[Any],
        what: str = "",
        *,
        metadata: Metadata = (),
        timeout_s: float | None = None,
    ) -> Any:
        """A client-streaming call to the first address, never retried (the requests are
        consumed as they are sent)."""
        timeout, sent, _ = self.plan(metadata, timeout_s)
        try:
            return getattr(self._stubs[self.order()[0]], method)(
                iter(requests), timeout=timeout, metadata=sent
            )
        except grpc.RpcError as exc:
            raise from_admin_rpc_error(exc, what or method) from None


class BlockingAdminClient(_BlockingCaller, _AdminCalls[Any]):
    """`AdminClient`'s twin for threads; it may be shared by them."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_s: float = RETRY_WINDOW_S,
        metadata: Metadata = (),
        credentials: Credentials | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        super().__init__(
            target, apb_grpc.AdminStub, timeout_s, retry_s, metadata, credentials, ca_file
        )

    def compact_topic(
        self, chunks: Iterable[apb.CompactionChunk], timeout_s: float
    ) -> apb.CompactionReply:
        reply: apb.CompactionReply = self.stream(
            "CompactTopic", chunks, "sending the compaction manifest", timeout_s=timeout_s
        )
        return reply


class BlockingControllerClient(_BlockingCaller, _ControllerCalls[Any]):
    """`ControllerClient`'s twin for threads; it may be shared by them."""

    def __init__(
        self,
        targets: str | Sequence[str],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_s: float = RETRY_WINDOW_S,
        metadata: Metadata = (),
        credentials: Credentials | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        super().__init__(
            targets, cpb_grpc.ControllerStub, timeout_s, retry_s, metadata, credentials, ca_file
        )


class BlockingPullClient(_BlockingCaller):
    """capstan.v1 Pull of what one broker stores: with `metadata` naming the call as
    forwarded, a replica answers from its own copy rather than passing it to its master."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retry_s: float = RETRY_WINDOW_S,
        metadata: Metadata = (),
        credentials: Credentials | None = None,
        ca_file: str | Path | None = None,
    ) -> None:
        super().__init__(
            target, ppb_grpc.PullStub, timeout_s, retry_s, metadata, credentials, ca_file
        )

    def pull_messages(self, request: ppb.PullMessagesRequest) -> ppb.PullMessagesResponse:
        reply: ppb.PullMessagesResponse = self.call("PullMessages", request)
        return reply
