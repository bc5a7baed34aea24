"""capstan.v1.Controller over grpc.aio: gathers a request's inputs, lets the ReplicaManager
decide and store, and answers with the group's replica info.

Calls are serialized (one asyncio lock) and run on a worker thread, because every change
is a compare-and-swap on the state store, which fsyncs (file) or calls the API server
(Kubernetes). Only the leading controller replica answers; the others refuse with
FAILED_PRECONDITION so brokers retry against the leader.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import grpc

from capstan.client.admin import AdminClient
from capstan.client.errors import ClientError
from capstan.common.errors import CapstanError
from capstan.common.zone import zone_problem
from capstan.controller.master_probe import GONE, master_answer
from capstan.controller.replica_manager import (
    GroupView,
    ReplicaManager,
    UnknownBroker,
    UnknownGroup,
)
from capstan.controller.state_store import StateCorrupt
from capstan.security.peers import passed_on_behalf, peer_security
from capstan.v1 import admin_pb2 as apb
from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc

T = TypeVar("T")

log = logging.getLogger(__name__)


def replica_info_message(view: GroupView) -> pb.ReplicaInfo:
    info = view.info
    return pb.ReplicaInfo(
        group=info.group,
        master_id=info.master_id or 0,
        master_address=view.master_address,
        master_epoch=info.master_epoch,
        sync_state_set=sorted(info.sync_state_set),
        sync_state_set_epoch=info.sync_state_set_epoch,
        replicas=[
            pb.BrokerReplica(
                broker_id=r.broker_id,
                address=r.address,
                alive=r.alive,
                epoch=r.epoch,
                max_offset=r.max_offset,
                seconds_since_heartbeat=r.seconds_since_heartbeat,
                pid=r.pid,
                zone=r.zone,
            )
            for r in view.replicas
        ],
    )


def leading(request: pb.RegisterBrokerRequest | pb.BrokerHeartbeatRequest) -> bool:
    """Whether the broker says it serves as master now; a broker that does not say (an
    older one) counts as leading, so it is never deposed on that account."""
    return request.leading if request.HasField("leading") else True


HAND_OVER_TIMEOUT_S = 15.0
"""How long a switchover of a group acknowledging by quorum may take: the master's handover
waits for its successor to hold everything (broker.HAND_OVER_MIN_S at least)."""
PASSED_ON_KEYS = frozenset({"x-capstan-forwarded"})
"""Metadata not passed on to the master asked to hand over (admin_front's too)."""
SILENT_WAIT_MAX_S = 0.5
"""How long a silent master's report may wait for its heartbeats to be old enough."""


class ControllerService(pb_grpc.ControllerServicer):
    def __init__(
        self,
        manager: ReplicaManager,
        controller_id: str,
        leading: Callable[[], bool],
        probe_lost_masters: bool = True,
        silent_master_s: float = 2.0,
    ) -> None:
        """`probe_lost_masters`: a slave's report that its master's stream broke or fell
        silent is checked and may elect at once; `silent_master_s`: how long a master that
        answers no probe must have been without heartbeats for that (0: never)
        (ControllerSettings.probe_lost_masters and silent_master_ms)."""
        self._manager = manager
        self._probe_lost_masters = probe_lost_masters
        self._silent_master_s = silent_master_s
        self._controller_id = controller_id
        self._leading = leading
        self._lock = asyncio.Lock()

    async def _run(self, context: Any, work: Callable[[], T], leader_only: bool = True) -> T:
        """Run `work` on a thread, one call at a time, mapping errors to status codes."""
        if leader_only and not self._leading():
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"controller {self._controller_id} is not the leader",
            )
        try:
            async with self._lock:
                return await asyncio.to_thread(work)
        except (UnknownGroup, UnknownBroker) as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except StateCorrupt as exc:
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except CapstanError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        raise AssertionError("unreachable: abort raises")

    @staticmethod
    async def _check(
        context: Any, group: str, broker_id: int | None = None, zone: str = ""
    ) -> None:
        if not group:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a group name is required")
        problem = zone_problem(zone)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if broker_id is not None and broker_id <= 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"broker ids are positive, not {broker_id}"
            )

    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: Any
    ) -> pb.RegisterBrokerReply:
        await self._check(context, request.group, zone=request.zone)
        if not request.identity or not request.address:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "a broker registers with an identity and address"
            )
        broker_id, view = await self._run(
            context,
            lambda: self._manager.register(
                request.group,
                request.identity,
                request.address,
                request.epoch,
                request.max_offset,
                request.pid,
                leading(request),
                request.zone,
            ),
        )
        return pb.RegisterBrokerReply(broker_id=broker_id, info=replica_info_message(view))

    async def BrokerHeartbeat(
        self, request: pb.BrokerHeartbeatRequest, context: Any
    ) -> pb.BrokerHeartbeatReply:
        await self._check(context, request.group, request.broker_id, request.zone)
        view = await self._run(
            context,
            lambda: self._manager.heartbeat(
                request.group,
                request.broker_id,
                request.address,
                request.epoch,
                request.max_offset,
                request.pid,
                leading(request),
                request.zone,
                ack_quorum=request.ack_quorum,
                final_at_epoch=request.final_at_epoch,
            ),
        )
        if request.master_lost_epoch and self._probe_lost_masters:
            view = await self._confirm_master_lost(context, request, view)
        return pb.BrokerHeartbeatReply(info=replica_info_message(view))

    async def _confirm_master_lost(
        self, context: Any, request: pb.BrokerHeartbeatRequest, view: GroupView
    ) -> GroupView:
        """A slave's stream from its master broke or fell silent: probe the master
        (master_probe.py) and elect now if it is plainly gone, or if it answers nothing
        and has sent no heartbeat for `silent_master_s` (stopped or hung); otherwise the
        heartbeat timeout decides."""
        master, epoch = view.info.master_id, view.info.master_epoch
        if master is None or master == request.broker_id or epoch != request.master_lost_epoch:
            return view  # the group moved on, or the report is about another master
        address = view.master_address
        answer = await master_answer(address) if address else "no address"
        if answer not in GONE and not await self._silent_since(request.group, master, answer):
            return view  # serving, or not silent for long enough: the heartbeats decide
        log.warning(
            "group %s: broker %d lost its stream from master %d (epoch %d), which answers "
            "no probe (%s, %.1f s since its last heartbeat): electing now",
            request.group,
            request.broker_id,
            master,
            epoch,
            answer,
            self._manager.liveness.seconds_since(request.group, master),
        )
        return await self._run(
            context, lambda: self._manager.master_lost(request.group, master, epoch)
        )

    async def _silent_since(self, group: str, master: int, answer: str) -> bool:
        """Whether a master that did not answer the probe (`answer`) has also been without
        heartbeats for `silent_master_s`, waiting out the rest of that time when it is
        short (the reporting slave's call has a deadline of its own)."""
        if answer == "SERVING" or self._silent_master_s <= 0:
            return False
        liveness = self._manager.liveness
        since = liveness.seconds_since(group, master)
        left = self._silent_master_s - since
        if since < 0 or left > SILENT_WAIT_MAX_S:
            return False
        if left > 0:
            await asyncio.sleep(left)
        return liveness.seconds_since(group, master) >= self._silent_master_s

    async def GetReplicaInfo(self, request: pb.GetReplicaInfoRequest, context: Any) -> Any:
        await self._check(context, request.group)
        view = await self._run(context, lambda: self._manager.view(request.group))
        return replica_info_message(view)

    async def AlterSyncStateSet(
        self, request: pb.AlterSyncStateSetRequest, context: Any
    ) -> pb.AlterSyncStateSetReply:
        await self._check(context, request.group, request.proposer_id)

        def alter() -> tuple[bool, str, GroupView]:
            result = self._manager.alter_sync_state_set(
                request.group,
                request.proposer_id,
                request.master_epoch,
                request.sync_state_set_epoch,
                frozenset(request.new_sync_state_set),
            )
            return result.accepted, result.reason, self._manager.view(request.group)

        accepted, reason, view = await self._run(context, alter)
        return pb.AlterSyncStateSetReply(
            accepted=accepted, reason=reason, info=replica_info_message(view)
        )

    async def ElectMaster(
        self, request: pb.ElectMasterRequest, context: Any
    ) -> pb.ElectMasterReply:
        await self._check(context, request.group)
        preferred = request.preferred_broker_id or None
        if preferred is not None and not request.handing_over_from:
            view = await self._run(context, lambda: self._manager.view(request.group))
            if self._by_quorum(view) and preferred != view.info.master_id and view.master_address:
                return await self._ask_master_to_hand_over(context, view, preferred)

        def elect() -> tuple[bool, str, GroupView]:
            changed, election = self._manager.elect(request.group, preferred)
            return changed, election.reason, self._manager.view(request.group)

        changed, reason, view = await self._run(context, elect)
        return pb.ElectMasterReply(changed=changed, reason=reason, info=replica_info_message(view))

    def _by_quorum(self, view: GroupView) -> bool:
        """Whether a member of the group's SyncStateSet may lack what its master
        acknowledged (the brokers acknowledge by a quorum smaller than the set)."""
        quorum = self._manager.ack_quorums.get(view.info.group, 0)
        return 0 < quorum < len(view.info.sync_state_set)

    async def _ask_master_to_hand_over(
        self, context: Any, view: GroupView, preferred: int
    ) -> pb.ElectMasterReply:
        """A switchover in a group acknowledging by quorum: the master holds its writes
        until `preferred` holds everything, then asks for it itself (handing_over_from);
        naming `preferred` at once could drop what the master acknowledged meanwhile."""
        request = apb.HandOverRequest(successor_broker_id=preferred)
        metadata = passed_on_behalf(context, PASSED_ON_KEYS)
        try:
            async with AdminClient(
                view.master_address, retry_s=0, ca_file=peer_security().ca_file
            ) as master:
                reply = await master.call(
                    "HandOver", request, metadata=metadata, timeout_s=HAND_OVER_TIMEOUT_S
                )
        except ClientError as exc:
            changed, reason = False, f"master {view.info.master_id} did not hand over: {exc}"
        else:
            changed, reason = reply.changed, reply.reason
        after = await self._run(context, lambda: self._manager.view(view.info.group))
        return pb.ElectMasterReply(changed=changed, reason=reason, info=replica_info_message(after))

    async def GetClusterStatus(
        self, request: pb.GetClusterStatusRequest, context: Any
    ) -> pb.ClusterStatus:
        def status() -> list[GroupView]:
            return [self._manager.view(g) for g in self._manager.group_names()]

        # Any replica answers (from the shared state); only the leader hears heartbeats, so
        # on a follower every broker shows as not alive.
        views = await self._run(context, status, leader_only=False)
        return pb.ClusterStatus(
            groups=[replica_info_message(v) for v in views],
            controller_id=self._controller_id,
            leader=self._leading(),
            unclean_election=self._manager.unclean,
        )
