"""The operator's calls to Capstan's controller: a group's replicas and SyncStateSet, and
moving a group's leadership to a chosen replica (the roller's and the scale-down's
SWITCH_MASTER step)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from capstan.common.channel_pool import CHANNEL_OPTIONS
from capstan.operator.broker_admin import CALL_TIMEOUT_S, Refused, Unreachable
from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc

_TEMPORARY = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.FAILED_PRECONDITION,  # a follower controller: the leader answers
}


class ControllerClient:
    def __init__(self, target: str) -> None:
        """`target` is the controller pod's stable name, host:port."""
        self.target = target
        self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.ControllerStub(self._channel)  # type: ignore[no-untyped-call]
        self._old: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await self._channel.close()

    def _reopen(self) -> None:
        """A fresh channel after a call went unanswered: a replaced controller pod has a new
        address under the same name, and a channel in reconnect backoff would keep trying
        the old one a while longer. The old channel closes in the background."""
        old = self._channel
        self._channel = grpc.aio.insecure_channel(self.target, options=CHANNEL_OPTIONS)
        self._stub = pb_grpc.ControllerStub(self._channel)  # type: ignore[no-untyped-call]
        closing = asyncio.ensure_future(old.close())
        self._old.add(closing)
        closing.add_done_callback(self._old.discard)

    async def group(self, name: str) -> pb.ReplicaInfo | None:
        """The group's replicas as the controller knows them; None before any registered."""
        what = f"reading group {name} from the controller"
        try:
            info: pb.ReplicaInfo = await self._answer(
                self._stub.GetReplicaInfo(
                    pb.GetReplicaInfoRequest(group=name), timeout=CALL_TIMEOUT_S
                ),
                what,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None
            raise self._raised(exc, what) from None
        return info

    async def switch_master(self, group: str, broker_id: int) -> pb.ReplicaInfo:
        """Ask for `broker_id` as the group's master; the answer's epoch confirms it.
        Refused when the controller will not (say, the broker is not in sync)."""
        try:
            reply: pb.ElectMasterReply = await self._answer(
                self._stub.ElectMaster(
                    pb.ElectMasterRequest(group=group, preferred_broker_id=broker_id),
                    timeout=CALL_TIMEOUT_S,
                ),
                f"moving the master of {group}",
            )
        except grpc.aio.AioRpcError as exc:
            raise self._raised(exc, f"moving the master of {group}") from None
        if reply.info.master_id != broker_id:
            raise Refused(f"the controller kept master {reply.info.master_id}: {reply.reason}")
        info: pb.ReplicaInfo = reply.info
        return info

    async def _answer(self, call: Any, what: str) -> Any:
        """The call's answer; Unreachable if none comes a little after its deadline (a call
        the channel never completes is cancelled rather than waited on for ever)."""
        pending = asyncio.ensure_future(call)
        done, _ = await asyncio.wait({pending}, timeout=CALL_TIMEOUT_S + 5)
        if not done:
            call.cancel()
            pending.cancel()
            self._reopen()
            raise Unreachable(f"{what}: no answer within {CALL_TIMEOUT_S + 5:.0f} s")
        return pending.result()

    def _raised(self, exc: grpc.aio.AioRpcError, what: str) -> Exception:
        detail = f"{what}: {exc.code().name}: {exc.details()}"
        if exc.code() in _TEMPORARY:
            if exc.code() is not grpc.StatusCode.FAILED_PRECONDITION:
                self._reopen()
            return Unreachable(detail)
        return Refused(detail)
