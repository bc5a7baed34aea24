"""The admin and controller clients against a real broker process and real controller
services: typed errors, retries while a server is not there, the caller's metadata, and
following the controller's leader."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from capstan.client.admin import (
    AdminClient,
    BlockingAdminClient,
    BlockingControllerClient,
    ControllerClient,
)
from capstan.client.errors import AlreadyExists, NotFound, NotReady, TransportError
from capstan.controller.broker_liveness import BrokerLiveness
from capstan.controller.controller_service import ControllerService
from capstan.controller.replica_manager import ReplicaManager
from capstan.controller.state_store import FileStateStore
from capstan.v1 import admin_pb2 as apb
from capstan.v1 import admin_pb2_grpc as apb_grpc
from capstan.v1 import controller_pb2 as cpb
from tests.broker.broker_process import BrokerProcess, free_port
from tests.controller.test_controller_service import Served


def test_topic_calls_and_their_typed_errors(broker: BrokerProcess) -> None:
    async def scenario() -> None:
        async with AdminClient(broker.address) as admin:
            await admin.create_topic(
                apb.Topic(name="Admin1", read_queue_nums=2, write_queue_nums=2, perm=6)
            )
            reply = await admin.describe_topic("Admin1")
            assert [q.queue_id for q in reply.topic.queues] == [0, 1]
            with pytest.raises(AlreadyExists, match="creating topic Admin1"):
                await admin.create_topic(
                    apb.Topic(name="Admin1", read_queue_nums=2, write_queue_nums=2, perm=6)
                )
            assert (await admin.delete_topic("Admin1")).deleted
            with pytest.raises(NotFound, match="describing topic Admin1") as missing:
                await admin.describe_topic("Admin1")
            assert not missing.value.retriable

    asyncio.run(scenario())


def test_the_blocking_twin_lists_what_the_broker_has(broker: BrokerProcess) -> None:
    broker.create_group("AdminG")
    with BlockingAdminClient(broker.address) as admin:
        names = [g.group.name for g in admin.list_groups().groups]
        assert "AdminG" in names
        assert admin.describe_group("AdminG").group.group.name == "AdminG"
        with pytest.raises(NotFound):
            admin.describe_group("no-such-group")


def test_a_server_that_is_not_there_is_retried_then_a_retriable_error() -> None:
    port = free_port()
    with BlockingAdminClient(f"127.0.0.1:{port}", retry_s=1.0) as admin:
        started = time.monotonic()
        with pytest.raises(TransportError) as failed:
            admin.list_topics()
        assert failed.value.retriable and failed.value.code == "UNAVAILABLE"
        assert 1.0 <= time.monotonic() - started < 8


def test_calls_sharing_a_client_each_get_their_own_answer_when_nothing_serves() -> None:
    # One call finding nothing there replaces the channel; the others on it, still running,
    # must end with their own UNAVAILABLE, not be cancelled by that (the controller's admin
    # front shares one client per replica between concurrent calls).
    dead = f"127.0.0.1:{free_port()}"

    async def scenario() -> list[object]:
        async with AdminClient(dead, retry_s=0, timeout_s=5) as admin:
            calls = [admin.describe_topic(f"T{i}") for i in range(24)]
            return await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)

    answers = asyncio.run(scenario())
    assert [type(a).__name__ for a in answers] == ["TransportError"] * 24
    assert {a.code for a in answers if isinstance(a, TransportError)} == {"UNAVAILABLE"}


def test_a_broker_that_starts_within_the_retry_window_answers(tmp_path: Path) -> None:
    process = BrokerProcess(tmp_path)  # its port is chosen, not yet listened on

    async def scenario() -> list[str]:
        async with AdminClient(process.address, retry_s=60) as admin:
            reply = await admin.list_topics(apb.ListTopicsRequest(include_system=True))
            return [t.topic.name for t in reply.topics]

    starting = threading.Timer(0.5, process.start)
    starting.start()
    try:
        assert "SCHEDULE_TOPIC_XXXX" in asyncio.run(scenario())  # a system topic
    finally:
        starting.join()
        process.stop()


@pytest.fixture
def two_controllers(tmp_path: Path) -> Iterator[tuple[list[Served], list[bool]]]:
    """Two controller services sharing one state directory; `leading[i]` says which leads."""
    leading = [False, True]
    served = []
    for i in range(2):
        manager = ReplicaManager(FileStateStore(tmp_path), BrokerLiveness(5.0), unclean=False)
        served.append(Served(ControllerService(manager, f"c{i}", lambda i=i: leading[i])))
    try:
        yield served, leading
    finally:
        for s in served:
            s.close()


def _register(served: Served, group: str) -> None:
    served.stub.RegisterBroker(
        cpb.RegisterBrokerRequest(group=group, address="127.0.0.1:1", identity="b1"),
        timeout=5,
    )


def test_a_controller_client_follows_the_leader(two_controllers) -> None:
    served, leading = two_controllers
    _register(served[1], "G1")
    addresses = [f"127.0.0.1:{s.port}" for s in served]
    with (
        BlockingControllerClient(addresses[:1], retry_s=0) as follower_only,
        pytest.raises(NotReady, match="c0 is not the leader"),
    ):
        follower_only.elect_master("G1", 1)
    with BlockingControllerClient(addresses) as controller:
        assert controller.elect_master("G1", 1).info.master_id == 1  # c0 said no first
        leading[:] = [True, False]  # c0 leads now; it shares c1's state directory
        assert controller.elect_master("G1", 1).info.master_id == 1
        leading[:] = [False, False]
        with pytest.raises(NotReady, match="not the leader"):
            controller.elect_master("G1", 1)


def test_the_asyncio_controller_client_skips_a_dead_address(two_controllers) -> None:
    served, _ = two_controllers
    _register(served[1], "G2")
    dead = f"127.0.0.1:{free_port()}"

    async def scenario() -> str:
        async with ControllerClient([dead, f"127.0.0.1:{served[1].port}"]) as controller:
            info = await controller.replica_info("G2")
            return str(info.group)

    assert asyncio.run(scenario()) == "G2"


def test_the_cluster_status_comes_from_the_leader_when_one_of_the_addresses_leads(
    two_controllers,
) -> None:
    """A follower answers the status too, but with every broker not alive (it hears no
    heartbeats): with the leader among the addresses, the leader's answer is the one taken,
    whichever address answered first; with none leading, a follower's is."""
    served, leading = two_controllers
    addresses = [f"127.0.0.1:{s.port}" for s in served]  # the follower first

    async def asked() -> tuple[str, bool]:
        async with ControllerClient(addresses, retry_s=0) as controller:
            status = await controller.cluster_status()
            return str(status.controller_id), bool(status.leader)

    assert asyncio.run(asked()) == ("c1", True)
    with BlockingControllerClient(addresses, retry_s=0) as controller:
        assert (controller.cluster_status().controller_id, controller.cluster_status().leader) == (
            "c1",
            True,
        )
        leading[:] = [False, False]
        assert controller.cluster_status().leader is False  # an answer all the same
    assert asyncio.run(asked())[1] is False


class _RecordingAdmin(apb_grpc.AdminServicer):
    """Answers ListTopics with nothing and keeps each call's metadata."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def ListTopics(self, request, context):
        self.seen.append(dict(context.invocation_metadata()))
        return apb.ListTopicsReply()


def test_the_callers_metadata_goes_with_every_call() -> None:
    recording = _RecordingAdmin()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    apb_grpc.add_AdminServicer_to_server(recording, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with BlockingAdminClient(f"127.0.0.1:{port}", metadata=[("x-caller", "cli")]) as admin:
            admin.list_topics()
            admin.call("ListTopics", apb.ListTopicsRequest(), metadata=[("x-extra", "1")])
    finally:
        server.stop(None)
    assert recording.seen[0]["x-caller"] == "cli" and "x-extra" not in recording.seen[0]
    assert (recording.seen[1]["x-caller"], recording.seen[1]["x-extra"]) == ("cli", "1")
