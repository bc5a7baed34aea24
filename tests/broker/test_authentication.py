"""A broker with authentication on, called by the official client and by raw stubs with
right, wrong, missing and expired signatures, and by users whose policies allow some
things and not others."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf import message_factory
from rocketmq import (
    ClientConfiguration,
    Credentials,
    FilterExpression,
    Message,
    Producer,
    SimpleConsumer,
)
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc as svc_grpc

from capstan.broker.store.user_table import UserTable
from capstan.security.acl import PolicyEntry, User
from capstan.security.signature import Credentials as Keys
from capstan.security.signature import signed_metadata
from capstan.v1 import admin_pb2 as admin
from capstan.v1 import admin_pb2_grpc as admin_grpc
from tests.broker.broker_process import BrokerProcess, open_channel
from tests.hostile_calls import Method, payloads, served_methods

ADMIN = Keys("admin", "admin-secret-1")
CLUSTER_SECRET = "the-cluster-secret-of-this-test"


def policy(*entries: dict[str, object]) -> tuple[PolicyEntry, ...]:
    return tuple(PolicyEntry.from_document(e) for e in entries)


USERS = [
    # Publishes to orders alone.
    User("orders-writer", "writer-secret", policy=policy(
        {"resources": ["Topic:orders"], "actions": ["Pub"], "decision": "Allow"},
    )),
    # Consumes orders as group billing, publishes nothing.
    User("billing", "billing-secret", policy=policy(
        {"resources": ["Topic:orders", "Group:billing"], "actions": ["Sub"], "decision": "Allow"},
    )),
    # Publishes anywhere but to the secret topic.
    User("careful", "careful-secret", policy=policy(
        {"resources": ["Topic:*"], "actions": ["Pub"], "decision": "Allow"},
        {"resources": ["Topic:secret"], "actions": ["Pub"], "decision": "Deny"},
    )),
    User("gone", "gone-secret-1", enabled=False, policy=policy(
        {"resources": ["*"], "actions": ["All"], "decision": "Allow"},
    )),
]  # fmt: skip


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    root = tmp_path_factory.mktemp("secure-broker")
    credentials = root / "admin-credentials.json"
    credentials.write_text(json.dumps({"access_key": "admin", "secret_key": "admin-secret-1"}))
    users = UserTable(root / "data" / "store" / "config" / "users.json")
    for user in USERS:
        users.put(user)
    cluster_secret = root / "cluster-secret"
    cluster_secret.write_text(CLUSTER_SECRET)
    auth = {
        "enabled": True,
        "init_user_file": str(credentials),
        "cluster_secret_file": str(cluster_secret),
    }
    broker = BrokerProcess(root, credentials=ADMIN, auth=auth)
    broker.start()
    try:
        for name in ("orders", "payments", "secret"):
            broker.create_topic(name)
        broker.create_group("billing")
        yield broker
    finally:
        broker.stop()


def config(broker: BrokerProcess, ak: str = "", sk: str = "") -> ClientConfiguration:
    return ClientConfiguration(broker.address, Credentials(ak, sk), request_timeout=5)


def message(topic: str, body: bytes) -> Message:
    m = Message()
    m.topic = topic
    m.body = body
    return m


def send_as(broker: BrokerProcess, ak: str, sk: str, topic: str) -> str:
    """The error the official producer raised sending one message, or '' when it was sent."""
    producer = Producer(config(broker, ak, sk))
    producer.startup()
    try:
        producer.send(message(topic, b"hello"))
        return ""
    except Exception as exc:  # noqa: BLE001 - the client raises its own exception types
        return str(exc)
    finally:
        producer.shutdown()


def raw_send(broker: BrokerProcess, metadata: list[tuple[str, str]], topic: str) -> pb.Status:
    stub = svc_grpc.MessagingServiceStub(grpc.insecure_channel(broker.address))
    request = svc.SendMessageRequest(
        messages=[
            pb.Message(
                topic=pb.Resource(name=topic),
                body=b"raw",
                system_properties=pb.SystemProperties(message_id="01AUTHTEST"),
            )
        ]
    )
    return stub.SendMessage(request, metadata=metadata, timeout=5).status


def test_the_official_client_with_right_credentials_sends(secure_broker: BrokerProcess):
    assert send_as(secure_broker, "orders-writer", "writer-secret", "orders") == ""
    assert send_as(secure_broker, "admin", "admin-secret-1", "payments") == ""


def test_wrong_missing_unknown_and_disabled_credentials_are_refused(secure_broker):
    for ak, sk in (
        ("orders-writer", "not-the-secret"),
        ("", ""),
        ("nobody", "whatever-secret"),
        ("gone", "gone-secret-1"),
    ):
        error = send_as(secure_broker, ak, sk, "orders")
        assert error, f"{ak!r} was let through"
        assert "not-the-secret" not in error and "gone-secret-1" not in error


def expired_refusals(broker: BrokerProcess) -> float:
    url = f"http://127.0.0.1:{broker.http_port}/metrics"
    for line in urllib.request.urlopen(url, timeout=5).read().decode().splitlines():
        if line.startswith('capstan_auth_failures_total{reason="expired"}'):
            return float(line.split()[-1])
    raise AssertionError("the broker counts no expired signatures")


def test_the_official_client_signing_by_a_clock_an_hour_behind_is_refused_as_expired(
    secure_broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
):
    """Its signatures carry its clock's time: an hour out is past the allowed skew, and the
    same keys go through once its clock is right again."""
    import rocketmq.v5.util.signature as official_signing

    class HourBehind(datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
            return datetime.now(tz) - timedelta(hours=1)

    before = expired_refusals(secure_broker)
    monkeypatch.setattr(official_signing, "datetime", HourBehind)
    error = send_as(secure_broker, "orders-writer", "writer-secret", "orders")
    assert error and "writer-secret" not in error  # the client says only that it failed
    assert expired_refusals(secure_broker) > before  # the broker says why
    monkeypatch.undo()
    assert send_as(secure_broker, "orders-writer", "writer-secret", "orders") == ""


def test_each_refusal_of_a_signature_says_why(secure_broker: BrokerProcess):
    def status(metadata: list[tuple[str, str]]) -> pb.Status:
        return raw_send(secure_broker, metadata, "orders")

    wrong = status(signed_metadata(Keys("orders-writer", "guessed-secret")))
    assert wrong.code == pb.UNAUTHORIZED and "does not match" in wrong.message
    assert "guessed" not in wrong.message
    missing = status([])
    assert missing.code == pb.UNAUTHORIZED and "not signed" in missing.message
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    expired = status(signed_metadata(Keys("orders-writer", "writer-secret"), hour_ago))
    assert expired.code == pb.UNAUTHORIZED and "from the server's clock" in expired.message
    disabled = status(signed_metadata(Keys("gone", "gone-secret-1")))
    assert disabled.code == pb.UNAUTHORIZED and "disabled" in disabled.message
    fine = status(signed_metadata(Keys("orders-writer", "writer-secret")))
    assert fine.code == pb.OK


def test_a_user_may_publish_only_where_its_policy_allows(
    secure_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
):
    refused = raw_send(
        secure_broker, signed_metadata(Keys("orders-writer", "writer-secret")), "payments"
    )
    assert refused.code == pb.FORBIDDEN
    assert "Pub on Topic:payments" in refused.message and "orders-writer" in refused.message

    # The official client refuses to send when its route lookup is refused, and logs why.
    assert send_as(secure_broker, "orders-writer", "writer-secret", "payments")
    assert "40300, orders-writer may not Pub|Sub on Topic:payments" in caplog.text


def test_a_deny_beats_an_allow(secure_broker: BrokerProcess):
    careful = signed_metadata(Keys("careful", "careful-secret"))
    assert raw_send(secure_broker, careful, "payments").code == pb.OK
    denied = raw_send(secure_broker, careful, "secret")
    assert denied.code == pb.FORBIDDEN and "denied by a policy" in denied.message


def test_a_subscriber_consumes_but_may_not_publish(
    secure_broker: BrokerProcess, caplog: pytest.LogCaptureFixture
):
    assert send_as(secure_broker, "orders-writer", "writer-secret", "orders") == ""
    consumer = SimpleConsumer(
        config(secure_broker, "billing", "billing-secret"),
        "billing",
        {"orders": FilterExpression("*")},
        await_duration=2,
    )
    consumer.startup()
    try:
        got = consumer.receive(32, 10)
        assert got, "billing received nothing from orders"
        for m in got:
            consumer.ack(m)
    finally:
        consumer.shutdown()
    # A route lookup needs Pub or Sub, which billing holds; the send itself needs Pub.
    error = send_as(secure_broker, "billing", "billing-secret", "orders")
    assert error and "billing may not Pub on Topic:orders" in caplog.text


def test_a_normal_user_is_refused_admin_calls_and_a_stranger_is_not_heard(secure_broker):
    as_writer = admin_grpc.AdminStub(
        open_channel(secure_broker.address, credentials=Keys("orders-writer", "writer-secret"))
    )
    with pytest.raises(grpc.RpcError) as refused:
        as_writer.CreateTopic(admin.Topic(name="mine", read_queue_nums=1, write_queue_nums=1))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "Create on Topic:mine" in refused.value.details()
    with pytest.raises(grpc.RpcError) as listing:
        as_writer.ListTopics(admin.ListTopicsRequest())
    assert listing.value.code() == grpc.StatusCode.PERMISSION_DENIED
    stranger = admin_grpc.AdminStub(grpc.insecure_channel(secure_broker.address))
    with pytest.raises(grpc.RpcError) as unsigned:
        stranger.DeleteTopic(admin.TopicRequest(name="orders"))
    assert unsigned.value.code() == grpc.StatusCode.UNAUTHENTICATED
    listed = secure_broker.admin().ListTopics(admin.ListTopicsRequest()).topics
    assert "orders" in [t.topic.name for t in listed]  # the stranger deleted nothing


def test_a_whole_policy_replaced_at_once_takes_effect_on_the_next_call(
    secure_broker: BrokerProcess,
):
    """UpdateUser with replace_policy (how the operator applies a CapstanUser): the new
    policy holds from the next call, and an empty one leaves the user no right at all."""
    keys = Keys("mover", "mover-secret")
    adm = secure_broker.admin()
    adm.CreateUser(
        admin.User(
            username="mover",
            secret_key=keys.secret_key,
            policy=[admin.PolicyEntry(resources=["Topic:orders"], actions=["Pub"])],
        )
    )
    assert raw_send(secure_broker, signed_metadata(keys), "orders").code == pb.OK
    moved = adm.UpdateUser(
        admin.User(
            username="mover",
            replace_policy=True,
            policy=[admin.PolicyEntry(resources=["Topic:payments"], actions=["Pub"])],
        )
    )
    assert [list(e.resources) for e in moved.user.policy] == [["Topic:payments"]]
    assert raw_send(secure_broker, signed_metadata(keys), "orders").code == pb.FORBIDDEN
    assert raw_send(secure_broker, signed_metadata(keys), "payments").code == pb.OK
    # Without replace_policy an update leaves the policy alone.
    kept = adm.UpdateUser(admin.User(username="mover", user_type="Normal"))
    assert [list(e.resources) for e in kept.user.policy] == [["Topic:payments"]]
    emptied = adm.UpdateUser(admin.User(username="mover", replace_policy=True))
    assert not emptied.user.policy
    assert raw_send(secure_broker, signed_metadata(keys), "payments").code == pb.FORBIDDEN
    with pytest.raises(grpc.RpcError) as bad:
        adm.UpdateUser(
            admin.User(
                username="mover",
                replace_policy=True,
                policy=[admin.PolicyEntry(resources=["Topic:x"], actions=["Fly"])],
            )
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "Fly" in bad.value.details()


def test_an_unsigned_request_is_refused_before_it_is_parsed(secure_broker: BrokerProcess):
    channel = grpc.insecure_channel(secure_broker.address)
    call = channel.unary_unary("/capstan.v1.Admin/CreateTopic")
    with pytest.raises(grpc.RpcError) as refused:
        call(b"\xff\xff\xff not a protobuf", timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_refusals_are_counted_by_reason(secure_broker: BrokerProcess):
    raw_send(secure_broker, signed_metadata(Keys("orders-writer", "bad-secret")), "orders")
    raw_send(secure_broker, signed_metadata(Keys("careful", "careful-secret")), "secret")
    url = f"http://127.0.0.1:{secure_broker.http_port}/metrics"
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    counts = {
        line.split('reason="')[1].split('"')[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("capstan_auth_failures_total{")
    }
    assert counts["wrong_signature"] >= 1 and counts["forbidden"] >= 1
    assert "admin-secret-1" not in text and "writer-secret" not in text


def test_the_users_file_is_the_brokers_alone(secure_broker: BrokerProcess):
    users = Path(secure_broker.root) / "data" / "store" / "config" / "users.json"
    assert users.stat().st_mode & 0o777 == 0o600
    log = secure_broker.log.read_text()
    assert "authentication is on" in log
    for user in USERS:
        assert user.secret_key not in log
    assert "admin-secret-1" not in log


def test_replication_is_the_clusters_alone(secure_broker: BrokerProcess):
    """No user, not even a super user, may follow the master and be fed its CommitLog;
    the cluster's identity may."""
    from capstan.security.peers import CLUSTER_ACCESS_KEY
    from capstan.v1 import replication_pb2 as rpb
    from capstan.v1 import replication_pb2_grpc as rpb_grpc

    def probe(metadata: list[tuple[str, str]]) -> grpc.StatusCode:
        stub = rpb_grpc.ReplicaPeersStub(grpc.insecure_channel(secure_broker.address))
        try:
            stub.Probe(rpb.ProbeRequest(), metadata=metadata, timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    assert probe([]) == grpc.StatusCode.UNAUTHENTICATED
    assert probe(signed_metadata(ADMIN)) == grpc.StatusCode.PERMISSION_DENIED
    impostor = Keys(CLUSTER_ACCESS_KEY, "a-guessed-cluster-secret")
    assert probe(signed_metadata(impostor)) == grpc.StatusCode.UNAUTHENTICATED
    # The cluster's call reaches the service, which judges the (empty) request itself.
    admitted = probe(signed_metadata(Keys(CLUSTER_ACCESS_KEY, CLUSTER_SECRET)))
    assert admitted == grpc.StatusCode.INVALID_ARGUMENT

    # Following the master (the CommitLog stream) and fetching its records: the same.
    def follow(metadata: list[tuple[str, str]]) -> tuple[grpc.StatusCode, str]:
        stub = rpb_grpc.ReplicationStub(grpc.insecure_channel(secure_broker.address))
        opening = rpb.ReplicaToMaster(follow=rpb.Follow(broker_name="any", broker_id=9))
        try:
            for _ in stub.Replicate(iter([opening]), metadata=metadata, timeout=5):
                return grpc.StatusCode.OK, "fed"
        except grpc.RpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    def fetch(metadata: list[tuple[str, str]]) -> grpc.StatusCode:
        stub = rpb_grpc.ReplicationStub(grpc.insecure_channel(secure_broker.address))
        try:
            stub.FetchRecord(rpb.FetchRecordRequest(offset=0), metadata=metadata, timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    for metadata, code in (
        ([], grpc.StatusCode.UNAUTHENTICATED),
        (signed_metadata(ADMIN), grpc.StatusCode.PERMISSION_DENIED),
        (signed_metadata(impostor), grpc.StatusCode.UNAUTHENTICATED),
    ):
        assert follow(metadata)[0] == code
        assert fetch(metadata) == code
    # The cluster's own stream reaches the master, which says it has no slaves to feed.
    cluster = signed_metadata(Keys(CLUSTER_ACCESS_KEY, CLUSTER_SECRET))
    assert follow(cluster)[0] == grpc.StatusCode.FAILED_PRECONDITION


def _answer(channel: grpc.Channel, method: Method, payload: bytes) -> tuple[grpc.StatusCode, bytes]:
    """The code an unsigned call ends with, and the first reply's bytes (if any)."""
    try:
        if method.client_streaming and method.server_streaming:
            stream = channel.stream_stream(method.path)(iter([payload]), timeout=5)
            return grpc.StatusCode.OK, next(iter(stream))
        if method.client_streaming:
            return grpc.StatusCode.OK, channel.stream_unary(method.path)(iter([payload]), timeout=5)
        if method.server_streaming:
            stream = channel.unary_stream(method.path)(payload, timeout=5)
            return grpc.StatusCode.OK, next(iter(stream))
        return grpc.StatusCode.OK, channel.unary_unary(method.path)(payload, timeout=5)
    except grpc.RpcError as exc:
        return exc.code(), b""


def test_an_unsigned_flood_of_hostile_calls_is_refused_unread_and_signed_calls_go_on(
    secure_broker: BrokerProcess,
):
    methods = [
        m
        for m in served_methods(secure_broker.address)
        if not m.path.startswith(("/grpc.health.", "/grpc.reflection."))
    ]
    rng = random.Random(28)
    calls = [(m, p.data) for m in methods for p in payloads(m, rng, 4)] * 5
    log_before = secure_broker.log.read_text()
    signed = signed_metadata(ADMIN)
    with ThreadPoolExecutor(8) as pool, grpc.insecure_channel(secure_broker.address) as channel:
        answers = list(pool.map(lambda c: (c[0], _answer(channel, c[0], c[1])), calls))
        during = raw_send(secure_broker, signed, "orders")  # while the flood runs
    assert during.code == pb.OK
    wrong = []
    for method, (code, reply) in answers:
        if method.path.startswith("/apache.rocketmq.v2."):
            out = (
                svc.DESCRIPTOR.services_by_name["MessagingService"]
                .methods_by_name[method.path.rsplit("/", 1)[1]]
                .output_type
            )
            status = message_factory.GetMessageClass(out).FromString(reply).status
            if code != grpc.StatusCode.OK or status.code != pb.UNAUTHORIZED:
                wrong.append(f"{method.path}: {code.name} {status.code}")
        elif code != grpc.StatusCode.UNAUTHENTICATED:
            wrong.append(f"{method.path}: {code.name}")
    assert wrong == []
    assert len(calls) >= 1000
    added = secure_broker.log.read_text()[len(log_before) :]
    assert "Traceback" not in added
    assert len(added.splitlines()) <= 10, added[-3000:]  # one line a minute per reason
