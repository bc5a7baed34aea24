"""The broker's side of capstan.v1.Controller: register, heartbeat, take the role it is
given, and ask for SyncStateSet changes as master.

The broker registers with a stable identity kept in its data dir (so a restart keeps its
broker id), then heartbeats every `heartbeat_interval_ms` with its last epoch, max offset
and whether it leads (a restarted master does not, until a reply names it again: the
controller first checks that no slave holds more than it came back with). Every reply
carries the group's replica info, and the broker acts on it:

* named master at a new epoch: stop following, record the epoch, take writes, start the
  master-only services (`Roles.lead`);
* someone else is master (or nobody is): stop acknowledging writes at once, follow the
  named master (`Roles.follow`).

While the broker follows no master (the last one was deposed and the next is being
elected: it has stopped copying and reports where its log ends), it beats every
`MASTERLESS_BEAT_S` instead of every interval, for at most `MASTERLESS_FAST_FOR_S`: the
quorum election waits for those reports and the elected broker learns it from a reply, so
at the usual 1-s interval an election cost the group two intervals without a master.

A reply at an epoch older than the broker already knows is ignored: it came from a
controller replica that had not caught up. The controller replicas are tried in turn; a
follower replica's FAILED_PRECONDITION, or one that cannot be reached, moves on to the next
at once, so a round reaches the leader wherever it is (after every controller restarted at
once, the next beat came a second later per replica tried).

While no controller can be reached (UNAVAILABLE: a controller restarting, every one
down), the next round comes `UNREACHABLE_RETRY_S` later rather than an interval later, for
up to `UNREACHABLE_FAST_FOR_S`, over channels that try to connect again at most
`QUICK_RECONNECT_BACKOFF_MS` apart: a group whose master died with its controller elects
once a slave's heartbeat (saying its master's stream broke) reaches the controller again,
and that now comes within a quarter of a second of the controller listening, not up to two
seconds after.

A round (the call, then the role change its reply calls for) that has not ended after
`ROUND_STUCK_S` makes the broker unhealthy (`stuck_s`, read by /healthz: the kubelet
restarts the container): a broker whose link no longer beats serves on, but the controller
counts it dead and it never rejoins. Where a round waits is logged once it has lasted
`ROUND_TELL_S`, whether or not anything asks for /healthz.
A CancelledError that does not cancel this task (a gRPC call cancelled under it) fails
the round, as any other error does, instead of ending the link.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import grpc

from capstan.broker.replication.replica_group import ReplicaGroup, Role
from capstan.common.aio_wait import awaited_stack, wait_event
from capstan.common.channel_pool import QUICK_RECONNECT_OPTIONS, ChannelPool
from capstan.common.durable_files import replace_durably
from capstan.security.peers import dial_peer
from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

IDENTITY_FILE = "broker.identity"
MASTERLESS_BEAT_S = 0.1
MASTERLESS_FAST_FOR_S = 5.0
"""A group left without any master for longer (nobody can be elected) is beaten at the
usual interval again."""
UNREACHABLE_RETRY_S = 0.1
"""The pause between rounds while no controller can be reached."""
UNREACHABLE_FAST_FOR_S = 60.0
"""Controllers unreachable for longer (a long outage) are tried at the usual interval."""
ROUND_TELL_S = 10.0
"""A round that has lasted this long logs where it waits (a round's calls have deadlines of
a couple of seconds)."""
ROUND_STUCK_S = 60.0
"""How long one round may last before the broker counts as unhealthy. A round's calls have
deadlines of a few seconds; what it may rightly wait on longer is a promotion dispatching
the queues of what was copied last."""


class Roles(Protocol):
    """What the broker does when its role changes (implemented by Broker)."""

    async def lead(
        self, epoch: int, sync_state_set: frozenset[int], sync_state_set_epoch: int
    ) -> None: ...

    async def follow(self, master_address: str, epoch: int) -> None: ...


def broker_identity(state_dir: Path) -> str:
    """This data dir's identity for the controller: made once, then read back."""
    path = state_dir / IDENTITY_FILE
    try:
        identity = path.read_text().strip()
    except FileNotFoundError:
        identity = ""
    if not identity:
        identity = uuid.uuid4().hex
        state_dir.mkdir(parents=True, exist_ok=True)
        replace_durably(path, (identity + "\n").encode())
    return identity


class ControllerLink:
    def __init__(
        self,
        group: ReplicaGroup,
        own_address: str,
        roles: Roles,
        identity: str,
        zone: Callable[[], str] = lambda: "",
    ) -> None:
        self._group = group
        self._zone = zone
        """The broker's zone as of each beat (capstan.common.zone.ZoneReader)."""
        self._own_address = own_address
        self._roles = roles
        self._identity = identity
        self._addresses = group.settings.controller_addresses
        self._index = 0
        self._channels = ChannelPool(dial_peer, QUICK_RECONNECT_OPTIONS)
        self._task: asyncio.Task[None] | None = None
        self._round_watch: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._failing = ""
        self._masterless_since: float | None = None
        self._unreachable_since: float | None = None
        """When (time.monotonic) the rounds began failing for want of a reachable
        controller; None while one answers."""
        self.registered = False
        self.info: pb.ReplicaInfo | None = None
        """The last replica info the controller sent."""
        self.replies = 0
        """How many replica infos have been taken: a caller that needs a view newer than
        some moment waits for this to pass what it read then."""
        self._round_began: float | None = None
        """When (time.monotonic) the round under way began; None between rounds."""
        self._stuck_told = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="controller-link")
        self._round_watch = asyncio.create_task(self._watch_rounds(), name="controller-rounds")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, self._round_watch) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = self._round_watch = None
        await self._channels.close()

    def beat_soon(self) -> None:
        """Heartbeat now rather than at the next interval: something changed that the
        controller should hear of, or that it may already know (a master's stream ended,
        a slave left)."""
        self._wake.set()

    @property
    def address(self) -> str:
        return self._addresses[self._index % len(self._addresses)]

    def _stub(self) -> pb_grpc.ControllerStub:
        return pb_grpc.ControllerStub(self._channels.get(self.address))  # type: ignore[no-untyped-call]

    @property
    def _timeout_s(self) -> float:
        return max(1.0, 2 * self._group.settings.heartbeat_interval_ms / 1000)

    def stuck_s(self) -> float:
        """How long the round under way has lasted past ROUND_STUCK_S (0 when none has)."""
        began = self._round_began
        over = 0.0 if began is None else time.monotonic() - began - ROUND_STUCK_S
        return max(0.0, over)

    async def _watch_rounds(self) -> None:
        """Log once where a round that has lasted ROUND_TELL_S waits."""
        while True:
            await asyncio.sleep(ROUND_TELL_S / 4)
            began = self._round_began
            if began is None or self._stuck_told or self._task is None:
                continue
            lasted = time.monotonic() - began
            if lasted >= ROUND_TELL_S:
                self._stuck_told = True
                log.error(
                    "the controller link's round has lasted %.0f s (no heartbeat since); it"
                    " waits at:\n  %s",
                    lasted,
                    "\n  ".join(awaited_stack(self._task)),
                )

    async def _run(self) -> None:
        interval = self._group.settings.heartbeat_interval_ms / 1000
        tried = 0  # controllers that failed this round
        while True:
            self._round_began = time.monotonic()
            try:
                await self.beat_once()
                tried = 0
                self._unreachable_since = None
                if self._failing:
                    log.info("controller %s answers again", self.address)
                    self._failing = ""
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                log.warning("a call to controller %s was cancelled under it", self.address)
                self._index += 1
            except grpc.aio.AioRpcError as exc:
                self._failed(exc)
                if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                    self._unreachable_since = None
                elif self._unreachable_since is None:
                    self._unreachable_since = time.monotonic()
                tried += 1
                if exc.code() is not grpc.StatusCode.NOT_FOUND and tried < len(self._addresses):
                    continue  # the next replica at once, not a beat later (it may lead)
                tried = 0
            except Exception:
                log.exception("the controller link failed; retrying")
            finally:
                self._round_began = None
                if self._stuck_told:
                    log.warning("the controller link's round that was stuck has ended")
                    self._stuck_told = False
            await wait_event(self._wake, self._pause(interval))
            self._wake.clear()

    def _pause(self, interval: float) -> float:
        """How long to wait before the next round."""
        pause = MASTERLESS_BEAT_S if self._masterless() else interval
        since = self._unreachable_since
        if since is not None and time.monotonic() - since < UNREACHABLE_FAST_FOR_S:
            pause = min(pause, UNREACHABLE_RETRY_S)
        return pause

    def _masterless(self) -> bool:
        """Whether this registered slave follows no master, and has not for long."""
        group = self._group
        if not self.registered or group.role is not Role.SLAVE or group.master_address:
            self._masterless_since = None
            return False
        now = time.monotonic()
        if self._masterless_since is None:
            self._masterless_since = now
        return now - self._masterless_since < MASTERLESS_FAST_FOR_S

    def _failed(self, exc: grpc.aio.AioRpcError) -> None:
        why = f"{exc.code().name}: {exc.details()}"
        if why != self._failing:
            log.warning("controller %s: %s", self.address, why)
            self._failing = why
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            self.registered = False  # the controller lost its state: register again
        else:
            self._index += 1  # a follower replica or an unreachable one: try the next

    async def beat_once(self) -> None:
        """One register-or-heartbeat round, then act on the reply (and, as master, ask for
        the SyncStateSet the master's view calls for)."""
        group = self._group
        last = group.epochs.last()
        epoch = last.epoch if last is not None else 0
        max_offset = group.store.max_phys_offset
        # False after a restart until a reply names this broker master: the controller then
        # checks that no SyncStateSet member holds more before letting it lead again.
        leading = group.role is Role.MASTER
        zone = self._zone()
        stub = self._stub()
        if not self.registered:
            reply = await stub.RegisterBroker(
                pb.RegisterBrokerRequest(
                    group=group.broker_name,
                    address=self._own_address,
                    identity=self._identity,
                    epoch=epoch,
                    max_offset=max_offset,
                    pid=os.getpid(),
                    leading=leading,
                    zone=zone,
                ),
                timeout=self._timeout_s,
            )
            if group.broker_id != reply.broker_id:
                log.info(
                    "registered with controller %s as broker %d of %s",
                    self.address,
                    reply.broker_id,
                    group.broker_name,
                )
            group.broker_id = reply.broker_id
            self.registered = True
            info = reply.info
        else:
            beat = await stub.BrokerHeartbeat(
                pb.BrokerHeartbeatRequest(
                    group=group.broker_name,
                    broker_id=group.broker_id,
                    address=self._own_address,
                    epoch=epoch,
                    max_offset=max_offset,
                    pid=os.getpid(),
                    leading=leading,
                    zone=zone,
                    master_lost_epoch=group.master_lost_epoch if not leading else 0,
                    ack_quorum=group.ack_quorum,
                    final_at_epoch=(
                        group.master_epoch
                        if group.role is Role.SLAVE and not group.master_address
                        else 0
                    ),
                ),
                timeout=self._timeout_s,
            )
            info = beat.info
        await self.apply(info)
        proposal = group.sync_state_set_proposal()
        if proposal is not None:
            await self._propose(stub, proposal)

    async def apply(self, info: pb.ReplicaInfo) -> None:
        """Take the role the controller's replica info gives this broker."""
        group = self._group
        if info.master_epoch < group.master_epoch:
            return  # from a controller replica behind the one that told us more
        self.info = info
        self.replies += 1
        members = frozenset(info.sync_state_set)
        if info.master_id == group.broker_id:
            if group.role is not Role.MASTER or group.master_epoch != info.master_epoch:
                await self._roles.lead(info.master_epoch, members, info.sync_state_set_epoch)
            else:
                group.set_sync_state_set(members, info.sync_state_set_epoch)
            return
        address = info.master_address if info.master_id else ""
        if (
            group.role is Role.MASTER
            or group.master_address != address
            or group.master_epoch != info.master_epoch
        ):
            await self._roles.follow(address, info.master_epoch)

    async def master_of(self, group: str) -> str:
        """The address of another group's master as the controller knows it ("" when it
        has none, or no controller answered)."""
        request = pb.GetReplicaInfoRequest(group=group)
        for _ in self._addresses:
            try:
                info = await self._stub().GetReplicaInfo(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() is grpc.StatusCode.NOT_FOUND:
                    return ""
                self._index += 1
                continue
            return str(info.master_address) if info.master_id else ""
        return ""

    async def switch_master(self, preferred: int) -> tuple[bool, str]:
        """Ask for a switchover to broker `preferred` and take the role the answer gives:
        (whether the master changed, the controller's reason). Each controller replica is
        tried once."""
        request = pb.ElectMasterRequest(
            group=self._group.broker_name,
            preferred_broker_id=preferred,
            handing_over_from=self._group.broker_id,
        )
        why = "no controller answered"
        for _ in self._addresses:
            try:
                reply = await self._stub().ElectMaster(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                why = f"{exc.code().name}: {exc.details()}"
                self._index += 1
                continue
            await self.apply(reply.info)
            return reply.changed, reply.reason
        return False, why

    async def _propose(self, stub: pb_grpc.ControllerStub, proposal: frozenset[int]) -> None:
        group = self._group
        reply = await stub.AlterSyncStateSet(
            pb.AlterSyncStateSetRequest(
                group=group.broker_name,
                proposer_id=group.broker_id,
                master_epoch=group.master_epoch,
                sync_state_set_epoch=group.sync_state_set_epoch,
                new_sync_state_set=sorted(proposal),
            ),
            timeout=self._timeout_s,
        )
        if reply.accepted:
            log.info("SyncStateSet of %s now %s", group.broker_name, sorted(proposal))
        else:
            log.warning("SyncStateSet change to %s refused: %s", sorted(proposal), reply.reason)
            group.proposal_refused()
        await self.apply(reply.info)
