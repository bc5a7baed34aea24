"""capstan.v1.Controller over real gRPC (a grpc.aio server on 127.0.0.1 in a thread): the
calls a broker makes, a switchover, a deposed master refused, bad input and a follower
controller refusing with FAILED_PRECONDITION."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from capstan.controller.broker_liveness import BrokerLiveness
from capstan.controller.controller_service import ControllerService
from capstan.controller.replica_manager import ReplicaManager
from capstan.controller.state_store import FileStateStore
from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc


class Served:
    """The service on a free port, its event loop on a daemon thread."""

    def __init__(self, service: ControllerService) -> None:
        self.loop = asyncio.new_event_loop()
        self.server: grpc.aio.Server | None = None
        ready = threading.Event()

        async def start() -> None:
            self.server = grpc.aio.server()
            pb_grpc.add_ControllerServicer_to_server(service, self.server)
            self.port = self.server.add_insecure_port("127.0.0.1:0")
            await self.server.start()
            ready.set()

        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(start(), self.loop)
        assert ready.wait(10)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.ControllerStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.channel.close()
        assert self.server is not None
        asyncio.run_coroutine_threadsafe(self.server.stop(None), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[Served, list[bool]]]:
    leading = [True]
    manager = ReplicaManager(FileStateStore(tmp_path), BrokerLiveness(5.0), unclean=False)
    s = Served(ControllerService(manager, "controller-1", lambda: leading[0]))
    try:
        yield s, leading
    finally:
        s.close()


def register(stub: pb_grpc.ControllerStub, identity: str, port: int) -> pb.RegisterBrokerReply:
    return stub.RegisterBroker(
        pb.RegisterBrokerRequest(
            group="broker-a", address=f"127.0.0.1:{port}", identity=identity, epoch=0
        ),
        timeout=5,
    )


def test_registration_heartbeat_switchover_and_fencing(served):
    s, _ = served
    first = register(s.stub, "a", 1001)
    assert first.broker_id == 1 and first.info.master_id == 1
    assert first.info.master_address == "127.0.0.1:1001"
    second = register(s.stub, "b", 1002)
    assert second.broker_id == 2 and list(second.info.sync_state_set) == [1]
    beat = s.stub.BrokerHeartbeat(
        pb.BrokerHeartbeatRequest(group="broker-a", broker_id=2, address="127.0.0.1:1002"),
        timeout=5,
    )
    assert beat.info.master_id == 1
    grow = s.stub.AlterSyncStateSet(
        pb.AlterSyncStateSetRequest(
            group="broker-a",
            proposer_id=1,
            master_epoch=1,
            sync_state_set_epoch=first.info.sync_state_set_epoch,
            new_sync_state_set=[1, 2],
        ),
        timeout=5,
    )
    assert grow.accepted and list(grow.info.sync_state_set) == [1, 2]
    switch = s.stub.ElectMaster(
        pb.ElectMasterRequest(group="broker-a", preferred_broker_id=2), timeout=5
    )
    assert switch.changed and switch.info.master_id == 2 and switch.info.master_epoch == 2
    stale = s.stub.AlterSyncStateSet(
        pb.AlterSyncStateSetRequest(
            group="broker-a",
            proposer_id=1,
            master_epoch=1,
            sync_state_set_epoch=grow.info.sync_state_set_epoch,
            new_sync_state_set=[1],
        ),
        timeout=5,
    )
    assert not stale.accepted and stale.reason
    status = s.stub.GetClusterStatus(pb.GetClusterStatusRequest(), timeout=5)
    [group] = status.groups
    assert group.master_id == 2 and [r.broker_id for r in group.replicas] == [1, 2]
    assert status.leader and not status.unclean_election


@pytest.mark.parametrize(
    ("call", "request_", "code"),
    [
        ("GetReplicaInfo", pb.GetReplicaInfoRequest(group="nope"), grpc.StatusCode.NOT_FOUND),
        ("GetReplicaInfo", pb.GetReplicaInfoRequest(group=""), grpc.StatusCode.INVALID_ARGUMENT),
        (
            "RegisterBroker",
            pb.RegisterBrokerRequest(group="g", address="h:1"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "BrokerHeartbeat",
            pb.BrokerHeartbeatRequest(group="broker-a", broker_id=-3),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (
            "BrokerHeartbeat",
            pb.BrokerHeartbeatRequest(group="broker-a", broker_id=9),
            grpc.StatusCode.NOT_FOUND,
        ),
        ("ElectMaster", pb.ElectMasterRequest(group="nope"), grpc.StatusCode.NOT_FOUND),
    ],
)
def test_bad_requests_get_a_precise_code(served, call, request_, code):
    s, _ = served
    register(s.stub, "a", 1001)
    with pytest.raises(grpc.RpcError) as err:
        getattr(s.stub, call)(request_, timeout=5)
    assert err.value.code() == code


def test_a_controller_that_does_not_lead_refuses(served):
    s, leading = served
    leading[0] = False
    with pytest.raises(grpc.RpcError) as err:
        register(s.stub, "a", 1001)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not the leader" in (err.value.details() or "")
    status = s.stub.GetClusterStatus(pb.GetClusterStatusRequest(), timeout=5)
    assert not status.leader  # status is answered, and says this replica does not lead


def beat(s: Served, broker_id: int, max_offset: int, **leading: bool) -> pb.ReplicaInfo:
    return s.stub.BrokerHeartbeat(
        pb.BrokerHeartbeatRequest(
            group="broker-a",
            broker_id=broker_id,
            address=f"127.0.0.1:{1000 + broker_id}",
            epoch=1,
            max_offset=max_offset,
            **leading,
        ),
        timeout=5,
    ).info


def in_sync_pair(s: Served, master_port: int) -> None:
    """Broker 1 ("a", at `master_port`) master, broker 2 ("b") a slave in its SyncStateSet."""
    first = register(s.stub, "a", master_port)
    register(s.stub, "b", 1002)
    s.stub.AlterSyncStateSet(
        pb.AlterSyncStateSetRequest(
            group="broker-a",
            proposer_id=1,
            master_epoch=1,
            sync_state_set_epoch=first.info.sync_state_set_epoch,
            new_sync_state_set=[1, 2],
        ),
        timeout=5,
    )


def test_a_master_saying_it_does_not_lead_gives_way_to_a_slave_holding_more(served):
    s, _ = served
    in_sync_pair(s, 1001)
    assert beat(s, 2, 1300, leading=False).master_id == 1
    # Unset (an older broker) counts as leading, like `leading=True`: never compared.
    assert beat(s, 1, 900).master_id == 1
    assert beat(s, 1, 900, leading=True).master_id == 1
    info = beat(s, 1, 900, leading=False)  # restarted with less than broker 2 holds
    assert (info.master_id, info.master_epoch, list(info.sync_state_set)) == (2, 2, [2])
    assert info.master_address == "127.0.0.1:1002"


def test_a_slave_that_lost_its_masters_stream_gets_an_election_once_a_probe_fails(served):
    """A slave's heartbeat saying its stream from the master broke: the controller asks the
    master's health service. While it answers SERVING nothing changes (the slave alone is
    cut off); once it does not (its port refuses), the slave is elected at once, long
    before the master's heartbeats would lapse (5 s here)."""
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    s, _ = served
    master_health = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, master_health)
    port = master_health.add_insecure_port("127.0.0.1:0")
    master_health.start()
    try:
        in_sync_pair(s, port)

        def report(epoch: int) -> pb.ReplicaInfo:
            return s.stub.BrokerHeartbeat(
                pb.BrokerHeartbeatRequest(
                    group="broker-a",
                    broker_id=2,
                    address="127.0.0.1:1002",
                    leading=False,
                    master_lost_epoch=epoch,
                ),
                timeout=5,
            ).info

        kept = report(1)
        assert (kept.master_id, kept.master_epoch) == (1, 1), "a serving master was deposed"
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        master_health.stop(None).wait(5)
        moved = report(1)
        assert (moved.master_id, moved.master_epoch) == (2, 2)
        # A late report about the old epoch changes nothing more.
        assert report(1).master_epoch == 2
    finally:
        master_health.stop(None)


def _answering_nothing() -> socket.socket:
    """A port that takes connections and never answers (a stopped process, or a machine too
    loaded to serve in time)."""
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(5)
    return listening


def _slave_reports_master_lost(s: Served) -> pb.ReplicaInfo:
    request = pb.BrokerHeartbeatRequest(
        group="broker-a", broker_id=2, address="127.0.0.1:1002", leading=False, master_lost_epoch=1
    )
    return s.stub.BrokerHeartbeat(request, timeout=10).info


def test_a_master_that_answers_no_probe_in_time_is_left_to_its_heartbeats(served):
    """Nothing answers while the master's heartbeats are fresh: that proves nothing, so the
    slave's report elects nobody."""
    s, _ = served
    with _answering_nothing() as silent:
        in_sync_pair(s, silent.getsockname()[1])
        info = _slave_reports_master_lost(s)
        assert (info.master_id, info.master_epoch) == (1, 1)


def test_a_master_that_answers_nothing_and_stopped_beating_is_replaced_on_its_slaves_report(
    served,
):
    """A stopped process (SIGSTOP): its port takes connections and never answers, and its
    heartbeats stop. Once the last one is 2 s old (silent_master_ms), the slave's report
    that the master fell silent elects at once, not after the 5 s heartbeat timeout."""
    s, _ = served
    with _answering_nothing() as stopped:
        in_sync_pair(s, stopped.getsockname()[1])
        time.sleep(1.6)  # the master's last heartbeat ages; within 0.5 s of 2 s
        info = _slave_reports_master_lost(s)
        assert (info.master_id, info.master_epoch) == (2, 2)
        assert list(info.sync_state_set) == [2]
