"""capstan.v1.Admin on the controller. The decisions over the groups' answers, then real
processes: a controller with two broker groups under it, where one call to the controller's
address creates (changes, deletes) a topic or consumer group on every group, the routes then
name both groups, the official client sends to and consumes from both, and a group that
cannot be reached is named."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from rocketmq import ClientConfiguration, Credentials, FilterExpression, Producer, SimpleConsumer
from rocketmq.grpc_protocol import definition_pb2 as v2
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.controller.group_answers import (
    NO_GROUPS,
    GroupOutcome,
    Refusal,
    change_refusal,
    lookup_refusal,
    merge_group,
    merge_topic,
    not_found,
    read_refusal,
    union_groups,
    union_topics,
)
from capstan.v1 import admin_pb2 as pb
from capstan.v1 import admin_pb2_grpc as pb_grpc
from capstan.v1 import consumer_pb2 as cpb
from tests.broker.broker_process import BrokerProcess
from tests.broker.test_official_client import message
from tests.broker.v2_requests import stub as v2_stub
from tests.cli.test_broker_cli import capstan
from tests.controller.controller_process import ControllerProcess
from tests.waiting import wait_until

Code = grpc.StatusCode


def failed(group: str, code: grpc.StatusCode, detail: str = "no") -> GroupOutcome:
    return GroupOutcome(group, code=code, detail=detail)


def test_a_change_is_ok_only_when_every_group_made_it():
    assert change_refusal("CreateTopic 'T'", [GroupOutcome("a", 1), GroupOutcome("b", 2)]) is None
    assert change_refusal("CreateTopic 'T'", []) == Refusal(Code.UNAVAILABLE, NO_GROUPS)


def test_the_same_failure_everywhere_keeps_its_code():
    refused = change_refusal(
        "CreateTopic 'T'",
        [failed("a", Code.ALREADY_EXISTS, "exists"), failed("b", Code.ALREADY_EXISTS, "exists")],
    )
    assert refused is not None and refused.code is Code.ALREADY_EXISTS
    assert refused.detail == (
        "CreateTopic 'T' failed on every broker group "
        "(a: ALREADY_EXISTS: exists; b: ALREADY_EXISTS: exists)"
    )


def test_a_partial_change_names_the_failed_groups_and_those_that_changed():
    outcomes = [GroupOutcome("a", 1), failed("b", Code.UNAVAILABLE, "down"), GroupOutcome("c", 1)]
    refused = change_refusal("DeleteTopic 'T'", outcomes)
    assert refused is not None and refused.code is Code.FAILED_PRECONDITION
    assert refused.detail == (
        "DeleteTopic 'T' failed on 1 of 3 broker groups (b: UNAVAILABLE: down); "
        "the change was made on a, c and stays"
    )
    # Different failures, nothing changed: no one code fits either.
    mixed = change_refusal("X", [failed("a", Code.NOT_FOUND), failed("b", Code.UNAVAILABLE)])
    assert mixed is not None and mixed.code is Code.FAILED_PRECONDITION
    assert "made on" not in mixed.detail


def test_a_read_fails_on_any_failed_group_but_missing_may_be_an_answer():
    here, missing = GroupOutcome("a", 1), failed("b", Code.NOT_FOUND, "topic 'T' not found")
    down = failed("c", Code.UNAVAILABLE, "down")
    assert read_refusal("R", [here, missing], missing_ok=True) is None
    strict = read_refusal("R", [here, missing], missing_ok=False)
    assert strict is not None and strict.code is Code.NOT_FOUND
    refused = read_refusal("R", [here, missing, down], missing_ok=True)
    assert refused == Refusal(Code.UNAVAILABLE, "R failed on a broker group (c: UNAVAILABLE: down)")
    assert not_found([missing]) == Refusal(
        Code.NOT_FOUND, "topic 'T' not found (asked every broker group)"
    )


def test_topics_are_listed_by_name_once_per_group_that_has_them():
    def listing(group: str, *names_queues: tuple[str, int]) -> pb.ListTopicsReply:
        return pb.ListTopicsReply(
            topics=[
                pb.TopicStatus(topic=pb.Topic(name=n, read_queue_nums=q), brokers=[group])
                for n, q in names_queues
            ]
        )

    union = union_topics([listing("a", ("B", 1), ("A", 1)), listing("b", ("B", 2), ("C", 2))])
    assert [(t.topic.name, t.brokers[0], t.topic.read_queue_nums) for t in union.topics] == [
        ("A", "a", 1),
        ("B", "a", 1),
        ("B", "b", 2),
        ("C", "b", 2),
    ]


def test_a_topic_described_on_several_groups_has_every_groups_queues():
    def status(group: str, queues: int) -> pb.TopicStatus:
        return pb.TopicStatus(
            topic=pb.Topic(name="T", read_queue_nums=queues),
            queues=[pb.QueueStatus(queue_id=q, broker=group) for q in range(queues)],
            brokers=[group],
        )

    merged = merge_topic([status("a", 2), status("b", 1)])
    assert merged.topic.read_queue_nums == 2 and list(merged.brokers) == ["a", "b"]
    assert [(q.broker, q.queue_id) for q in merged.queues] == [("a", 0), ("a", 1), ("b", 0)]


def test_consumer_groups_are_listed_by_name_once_per_broker_group():
    def listing(group: str, *names: str) -> pb.ListGroupsReply:
        return pb.ListGroupsReply(
            groups=[pb.GroupStatus(group=pb.Group(name=n), brokers=[group]) for n in names]
        )

    union = union_groups([listing("a", "Y", "X"), listing("b", "Y")])
    assert [(g.group.name, g.brokers[0]) for g in union.groups] == [
        ("X", "a"),
        ("Y", "a"),
        ("Y", "b"),
    ]


def test_a_message_found_by_id_is_the_answer_but_by_key_a_failed_group_is_named():
    by_id = pb.GetMessageRequest(topic="T", message_id="M")
    by_key = pb.GetMessageRequest(topic="T", key="k")
    down = failed("b", Code.UNAVAILABLE, "down")
    outcomes = [GroupOutcome("a", 1), down]
    assert lookup_refusal(by_id, outcomes, found=True) is None
    refused = lookup_refusal(by_key, outcomes, found=True)
    assert refused == Refusal(
        Code.UNAVAILABLE, "GetMessage failed on a broker group (b: UNAVAILABLE: down)"
    )
    assert lookup_refusal(by_id, outcomes, found=False) == refused
    missing = [failed("a", Code.NOT_FOUND, "no such message")]
    assert lookup_refusal(by_key, missing, found=False) == not_found(missing)


def test_a_consumer_group_seen_on_several_groups_adds_up():
    def status(lag: int, clients: list[str], inconsistency: str = "") -> pb.GroupStatus:
        return pb.GroupStatus(
            group=pb.Group(name="G", max_attempts=17),
            offsets=[pb.GroupQueueOffset(topic="T", queue_id=0, lag=lag)],
            clients=[pb.GroupClient(client_id=c) for c in clients],
            total_lag=lag,
            members=cpb.GroupMembers(
                group="G",
                members=[cpb.Member(client_id=c) for c in clients],
                inconsistency=inconsistency,
                subscriptions_consistent=not inconsistency,
            ),
        )

    a, b = status(3, ["x", "y"]), status(4, ["y", "z"], "y differs")
    a.brokers.append("a")
    b.brokers.append("b")
    merged = merge_group([a, b])
    assert merged.group.name == "G" and merged.total_lag == 7
    assert [o.lag for o in merged.offsets] == [3, 4]
    assert list(merged.brokers) == ["a", "b"]
    assert [c.client_id for c in merged.clients] == ["x", "y", "z"]
    assert [m.client_id for m in merged.members.members] == ["x", "y", "z"]
    assert not merged.members.subscriptions_consistent
    assert merged.members.inconsistency == "y differs"


@dataclass
class TwoGroups:
    controller: ControllerProcess
    groups: dict[str, list[BrokerProcess]]

    def admin(self) -> pb_grpc.AdminStub:
        return pb_grpc.AdminStub(grpc.insecure_channel(self.controller.address))  # type: ignore[no-untyped-call]

    def master(self, group: str) -> BrokerProcess:
        address = self.controller.group(group).master_address
        return next(b for b in self.groups[group] if b.address == address)

    def settled(self) -> bool:
        """Every group has a master with all its replicas in the SyncStateSet."""
        try:
            status = self.controller.status()
        except grpc.RpcError:
            return False
        ready = {
            g.group
            for g in status.groups
            if g.master_id and len(g.sync_state_set) == len(self.groups.get(g.group, ()))
        }
        return status.leader and ready == set(self.groups)

    def stop(self) -> None:
        for brokers in self.groups.values():
            for b in brokers:
                b.stop()
        self.controller.stop()


def start_two_groups(
    root: Path, replicas: dict[str, int], store: dict[str, object] | None = None
) -> TwoGroups:
    """A controller and one broker group per entry of `replicas` (name → replica count),
    started the way test_controlled_group.start_cluster starts one; `store` settings for
    every broker."""
    controller = ControllerProcess(root / "controller", root / "controller-state").start()
    cluster = TwoGroups(controller, {})
    try:
        for group, count in replicas.items():
            for i in range(count):
                (root / f"{group}-{i}").mkdir()
                broker = BrokerProcess(
                    root / f"{group}-{i}",
                    broker_name=group,
                    replication={
                        "controller_address": controller.address,
                        "replicas": count,
                        "heartbeat_interval_ms": 300,
                        "slave_ack_timeout_ms": 2000,
                    },
                    **({"store": store} if store else {}),
                )
                cluster.groups.setdefault(group, []).append(broker.start())
        wait_until(cluster.settled, 20, "a master in every group with its replicas in sync")
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoGroups]:
    # group-a has a slave: the controller may reach it first, and it passes calls on.
    c = start_two_groups(tmp_path_factory.mktemp("admin-front"), {"group-a": 2, "group-b": 1})
    try:
        yield c
    finally:
        c.stop()


def topic(name: str, queues: int = 4) -> pb.Topic:
    return pb.Topic(name=name, type=pb.NORMAL, read_queue_nums=queues, write_queue_nums=queues)


def describe_on(broker: BrokerProcess, name: str) -> pb.TopicStatus:
    return broker.admin(here=True).DescribeTopic(pb.TopicRequest(name=name), timeout=5).topic


def read_back(
    config: ClientConfiguration, group: str, topic: str, want: int, timeout_s: float
) -> list[bytes]:
    """`want` bodies of `topic` received by the official SimpleConsumer of `group`."""
    consumer = SimpleConsumer(config, group, {topic: FilterExpression("*")}, 2)
    consumer.startup()
    try:
        return receive_and_ack(consumer, want, timeout_s)
    finally:
        consumer.shutdown()


def receive_and_ack(consumer: SimpleConsumer, want: int, timeout_s: float) -> list[bytes]:
    """Bodies received (and acknowledged as they come, before they could be redelivered)."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for m in consumer.receive(32, 15):
            consumer.ack(m)
            got.append(m.body)
    return got


def lists_every_group(admin: pb_grpc.AdminStub) -> bool:
    try:
        admin.ListTopics(pb.ListTopicsRequest(), timeout=5)
    except grpc.RpcError:
        return False
    return True


def refusal(call: Callable[[], object]) -> grpc.RpcError:
    """The error `call` raises (it must raise one)."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_a_topic_created_through_the_controller_is_on_every_group_and_in_its_routes(cluster):
    admin = cluster.admin()
    made = admin.CreateTopic(topic("Everywhere"), timeout=10)
    assert made.topic.topic.name == "Everywhere"
    for group in cluster.groups:
        assert describe_on(cluster.master(group), "Everywhere").topic.write_queue_nums == 4
    routes = v2_stub(cluster.controller.address).QueryRoute(
        svc.QueryRouteRequest(topic=v2.Resource(name="Everywhere")), timeout=10
    )
    assert routes.status.code == v2.OK
    names = [q.broker.name for q in routes.message_queues]
    assert sorted(set(names)) == ["group-a", "group-b"]
    assert names.count("group-a") == names.count("group-b") == 4
    listed = admin.ListTopics(pb.ListTopicsRequest(), timeout=10)
    entries = [list(t.brokers) for t in listed.topics if t.topic.name == "Everywhere"]
    assert entries == [["group-a"], ["group-b"]]
    described = admin.DescribeTopic(pb.TopicRequest(name="Everywhere"), timeout=10).topic
    assert list(described.brokers) == ["group-a", "group-b"]
    assert [(q.broker, q.queue_id) for q in described.queues] == [
        (g, q) for g in ("group-a", "group-b") for q in range(4)
    ]
    again = refusal(lambda: admin.CreateTopic(topic("Everywhere"), timeout=10))
    assert again.code() is grpc.StatusCode.ALREADY_EXISTS
    assert "group-a" in again.details() and "group-b" in again.details()


def test_update_and_delete_through_the_controller_reach_every_group(cluster):
    admin = cluster.admin()
    admin.CreateTopic(topic("Changing"), timeout=10)
    admin.UpdateTopic(topic("Changing", queues=6), timeout=10)
    for group in cluster.groups:
        assert describe_on(cluster.master(group), "Changing").topic.read_queue_nums == 6
    assert admin.DeleteTopic(pb.TopicRequest(name="Changing"), timeout=10).deleted
    for group in cluster.groups:
        gone = refusal(lambda g=group: describe_on(cluster.master(g), "Changing"))
        assert gone.code() is grpc.StatusCode.NOT_FOUND
    gone = refusal(lambda: admin.DescribeTopic(pb.TopicRequest(name="Changing"), timeout=10))
    assert gone.code() is grpc.StatusCode.NOT_FOUND
    twice = refusal(lambda: admin.DeleteTopic(pb.TopicRequest(name="Changing"), timeout=10))
    assert twice.code() is grpc.StatusCode.NOT_FOUND


def test_the_official_client_sends_to_both_groups_and_a_group_made_there_consumes(cluster):
    admin = cluster.admin()
    admin.CreateTopic(topic("Spread"), timeout=10)
    admin.CreateGroup(pb.Group(name="Readers"), timeout=10)
    for group in cluster.groups:
        members = cluster.master(group).admin(here=True)
        assert members.DescribeGroup(pb.GroupRequest(name="Readers"), timeout=5).group.group
    config = ClientConfiguration(cluster.controller.address, Credentials(), request_timeout=3)
    producer = Producer(config, ("Spread",))
    producer.startup()
    sent = [f"spread-{i}".encode() for i in range(40)]
    try:
        for body in sent:
            producer.send(message("Spread", body))
    finally:
        producer.shutdown()
    stored = {g: sum(cluster.master(g).queue_ends("Spread", here=True)) for g in cluster.groups}
    assert all(count > 0 for count in stored.values()), stored
    assert sum(stored.values()) == len(sent)
    got = read_back(config, "Readers", "Spread", len(sent), timeout_s=20)
    assert sorted(got) == sorted(sent)

    def merged() -> pb.GroupStatus:
        return admin.DescribeGroup(pb.GroupRequest(name="Readers"), timeout=10).group

    # The brokers commit acknowledged pops as offsets in the background: four queues on each
    # group, all consumed.
    wait_until(lambda: len(merged().offsets) == 8, 10, "both groups' committed offsets")
    wait_until(lambda: merged().total_lag == 0, 10, "no lag on either group")
    assert {o.broker for o in merged().offsets} == {"group-a", "group-b"}
    listed = admin.ListGroups(pb.ListGroupsRequest(), timeout=10).groups
    assert [list(g.brokers) for g in listed if g.group.name == "Readers"] == [
        ["group-a"],
        ["group-b"],
    ]
    admin.DeleteGroup(pb.GroupRequest(name="Readers"), timeout=10)
    for group in cluster.groups:
        members = cluster.master(group).admin(here=True)
        missing = refusal(lambda m=members: m.DescribeGroup(pb.GroupRequest(name="Readers")))
        assert missing.code() is grpc.StatusCode.NOT_FOUND


def test_reset_offset_is_left_to_each_groups_master(cluster):
    request = pb.ResetOffsetRequest(group="G", topic="Everywhere", earliest=True)
    refused = refusal(lambda: cluster.admin().ResetOffset(request, timeout=10))
    assert refused.code() is grpc.StatusCode.UNIMPLEMENTED
    for group in cluster.groups:
        assert f"{group} at {cluster.master(group).address}" in refused.details()


def test_a_controller_that_does_not_lead_refuses(cluster, tmp_path: Path):
    follower = ControllerProcess(
        tmp_path, cluster.controller.config.parent.parent / "controller-state"
    )
    follower.start()
    try:
        admin = pb_grpc.AdminStub(grpc.insecure_channel(follower.address))  # type: ignore[no-untyped-call]
        refused = refusal(lambda: admin.CreateTopic(topic("Nowhere"), timeout=10))
        assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "not the leader" in refused.details()
    finally:
        follower.stop()


def test_the_cli_creates_and_lists_through_the_controller(cluster):
    server = ["--server", cluster.controller.address]
    made = capstan("topic", "create", "CliEverywhere", "--queues", "2", "--json", *server)
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["topic"]["write_queue_nums"] == 2
    for group in cluster.groups:
        assert describe_on(cluster.master(group), "CliEverywhere").topic.read_queue_nums == 2
    listed = capstan("topic", "list", "--json", *server)
    assert listed.returncode == 0, listed.stderr
    rows = [r for r in json.loads(listed.stdout)["topics"] if r["name"] == "CliEverywhere"]
    assert rows == [
        {
            "name": "CliEverywhere",
            "broker": group,
            "type": "NORMAL",
            "read_queues": 2,
            "write_queues": 2,
            "perm": 6,
            "messages": 0,
        }
        for group in ("group-a", "group-b")
    ]


@pytest.mark.slow  # waits out the dead group's calls, call after call (about a minute)
def test_a_group_that_cannot_be_reached_is_named_and_the_others_keep_the_change(tmp_path: Path):
    cluster = start_two_groups(tmp_path, {"group-a": 1, "group-b": 1})
    try:
        admin = cluster.admin()
        (down,) = cluster.groups["group-b"]
        down.kill9()
        refused = refusal(lambda: admin.CreateTopic(topic("Half"), timeout=10))
        assert refused.code() is grpc.StatusCode.FAILED_PRECONDITION
        detail = refused.details()
        assert "group-b: UNAVAILABLE" in detail and "made on group-a" in detail, detail
        assert describe_on(cluster.master("group-a"), "Half").topic.name == "Half"
        # No read leaves a group out: each names the one that did not answer.
        described = refusal(lambda: admin.DescribeTopic(pb.TopicRequest(name="Half"), timeout=10))
        assert described.code() is grpc.StatusCode.UNAVAILABLE
        assert "group-b: UNAVAILABLE" in described.details(), described.details()
        listing = refusal(lambda: admin.ListTopics(pb.ListTopicsRequest(), timeout=10))
        assert listing.code() is grpc.StatusCode.UNAVAILABLE and "group-b" in listing.details()
        for command in (
            ["topic", "describe", "Half"],
            ["topic", "list"],
            ["group", "list"],
            ["message", "get", "--topic", "Half", "--key", "k"],
        ):
            read = capstan(*command, "--server", cluster.controller.address)
            assert read.returncode == 1 and read.stdout == "", (command, read.stdout)
            assert "group-b: UNAVAILABLE" in read.stderr, (command, read.stderr)
        deleted = capstan("topic", "delete", "Half", "--server", cluster.controller.address)
        assert deleted.returncode == 1 and "group-b" in deleted.stderr, deleted.stderr
        assert "made on group-a" in deleted.stderr
        gone = refusal(lambda: describe_on(cluster.master("group-a"), "Half"))
        assert gone.code() is grpc.StatusCode.NOT_FOUND
        # Back again, the group is reached as soon as it leads (no long reconnect backoff).
        down.start()
        wait_until(cluster.settled, 20, "group-b to lead again")
        wait_until(lambda: lists_every_group(admin), 5, "the controller to reach group-b")
        admin.CreateTopic(topic("Half"), timeout=10)
        assert describe_on(down, "Half").topic.name == "Half"
    finally:
        cluster.stop()


def test_a_topic_is_not_called_missing_while_the_group_that_has_it_is_down(tmp_path: Path):
    """The controller answers QueryRoute for every group: a group that cannot be reached
    may have the topic, so the others' "not found" is not the answer (the clients drop a
    route they are told does not exist, and their consumers stop reading it)."""
    cluster = start_two_groups(tmp_path, {"group-a": 1, "group-b": 1})
    try:
        (holder,) = cluster.groups["group-b"]
        holder.admin(here=True).CreateTopic(topic("OnlyB"), timeout=10)
        at_controller = v2_stub(cluster.controller.address)

        def route(name: str) -> svc.QueryRouteResponse:
            request = svc.QueryRouteRequest(topic=v2.Resource(name=name))
            return at_controller.QueryRoute(request, timeout=10)

        found = route("OnlyB")
        assert found.status.code == v2.OK
        assert {mq.broker.name for mq in found.message_queues} == {"group-b"}
        assert route("Nowhere").status.code == v2.TOPIC_NOT_FOUND
        holder.kill9()
        for name in ("OnlyB", "Nowhere"):
            answer = route(name)
            assert answer.status.code == v2.INTERNAL_SERVER_ERROR, answer.status
            assert "not reached: group-b" in answer.status.message, answer.status.message
        holder.start()
        wait_until(lambda: route("OnlyB").status.code == v2.OK, 20, "group-b's route again")
    finally:
        cluster.stop()
