"""A controller and a master + slave group with TLS on every port and authentication on:
the group forms and replicates over TLS, signed as the cluster; a client with keys sends
through the controller's routes; a broker holding another cluster's secret is refused by
the controller and never joins."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capstan.client.admin import BlockingAdminClient
from capstan.client.errors import ClientError
from capstan.client.message import Message
from capstan.client.producer.producer import Producer
from capstan.operator import user_sync
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.security.peers import CLUSTER_ACCESS_KEY, FORWARDED_FOR, FORWARDED_PROOF
from capstan.security.signature import DATE_TIME, Credentials, signed_metadata
from capstan.v1 import admin_pb2 as apb
from tests.broker.broker_process import BrokerProcess
from tests.broker.replication.test_controlled_group import (
    GROUP,
    Cluster,
    start_cluster,
    stop_cluster,
)
from tests.security.certificates import tls_settings
from tests.waiting import wait_until

ADMIN = Credentials("root", "root-secret-1")
FORWARDED = (("x-capstan-forwarded", "1"),)


def secure_settings(root: Path, secret: str) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """(tls, auth) settings for processes on 127.0.0.1, and the CA's certificate."""
    tls, ca = tls_settings(root)
    (root / "cluster-secret").write_text(secret)
    keys = root / "admin-credentials.json"
    keys.write_text(json.dumps({"access_key": "root", "secret_key": "root-secret-1"}))
    auth = {
        "enabled": True,
        "cluster_secret_file": str(root / "cluster-secret"),
        "init_user_file": str(keys),
    }
    return tls, auth, ca.certificate


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path, dict]]:
    root = tmp_path_factory.mktemp("secure-cluster")
    tls, auth, ca = secure_settings(root, "the-cluster-secret-of-this-test")
    controller_auth = {"enabled": True, "cluster_secret_file": auth["cluster_secret_file"]}
    cluster = start_cluster(
        root,
        controller={"tls": tls, "auth": controller_auth, "ca": ca},
        broker={"tls": tls, "auth": auth, "credentials": ADMIN, "ca": ca},
    )
    try:
        wait_until(lambda: cluster.settled(2), 30, "a master with its slave in sync, over TLS")
        yield cluster, ca, tls
    finally:
        stop_cluster(cluster)


def test_the_group_replicates_over_tls_and_a_client_with_keys_sends_through_the_routes(secure):
    cluster, ca, _ = secure
    cluster.master().create_topic("Orders", queues=2)
    with Producer(cluster.controller.address, credentials=ADMIN, ca_file=str(ca)) as producer:
        receipts = [producer.send(Message("Orders", f"m{i}".encode())) for i in range(20)]
    assert len({r.message_id for r in receipts}) == 20
    slave = cluster.slave()
    with BlockingAdminClient(
        slave.address, metadata=FORWARDED, credentials=ADMIN, ca_file=ca
    ) as admin:

        def held() -> int:
            topic = admin.describe_topic("Orders").topic
            return sum(q.max_offset for q in topic.queues)

        wait_until(lambda: held() == 20, 10, "the slave to hold every message")


def test_a_broker_with_another_clusters_secret_never_joins(secure, tmp_path: Path):
    cluster, ca, tls = secure
    (tmp_path / "wrong-secret").write_text("not-the-cluster-secret-at-all")
    auth = {"enabled": True, "cluster_secret_file": str(tmp_path / "wrong-secret")}
    stranger = BrokerProcess(
        tmp_path,
        ca=ca,
        tls=tls,
        auth=auth,
        broker_name=GROUP,
        replication={
            "controller_address": cluster.controller.address,
            "replicas": 2,
            "heartbeat_interval_ms": 300,
        },
    )
    stranger.start()
    try:
        wait_until(
            lambda: "is for the cluster's own processes" in stranger.log.read_text(),
            15,
            "the controller to refuse the stranger",
        )
        replicas = {r.address for r in cluster.info().replicas}
        assert stranger.address not in replicas
        assert cluster.settled(2)
    finally:
        stranger.stop()


def test_the_operators_user_sync_grants_and_revokes_a_users_access_as_the_cluster(secure):
    """What the CapstanUser handler does, against a secured group: signed as the cluster
    (as the operator is), it creates the user with its whole policy on the master, the
    user's keys then send through the routes; a policy replaced in one update and the
    user's deletion each end the access at once."""
    cluster, ca, _ = secure
    cluster.master().create_topic("Invoices", queues=1)
    keys = Credentials("billing-app", "billing-app-secret-key-0123456789")
    operator_identity = Credentials(CLUSTER_ACCESS_KEY, "the-cluster-secret-of-this-test")
    spec = {
        "brokerGroups": [GROUP],
        "acl": [{"resources": ["Topic:Invoices"], "actions": ["Pub"]}],
    }

    def send() -> str:
        """'' when a message went, else the error."""
        try:
            with Producer(cluster.controller.address, credentials=keys, ca_file=str(ca)) as p:
                p.send(Message("Invoices", b"invoice"))
        except ClientError as exc:
            return str(exc)
        return ""

    async def sync(wanted: user_sync.WantedUser, keys_changed: bool) -> user_sync.UserStep:
        admin = BrokerGroupAdmin(
            cluster.master().address, "t", ca_file=ca, credentials=operator_identity
        )
        try:
            step = user_sync.next_user_step(wanted, await admin.user(wanted.name), keys_changed)
            if step.action is not user_sync.UserAction.IN_SYNC:
                request = user_sync.request_of(wanted, keys.secret_key, step)
                await admin.put_user(request, create=step.action is user_sync.UserAction.CREATE)
            return step
        finally:
            await admin.close()

    granted = user_sync.wanted_user("billing-app", spec)
    assert asyncio.run(sync(granted, True)).action is user_sync.UserAction.CREATE
    assert send() == ""
    assert asyncio.run(sync(granted, False)).action is user_sync.UserAction.IN_SYNC

    moved = user_sync.wanted_user(
        "billing-app", {**spec, "acl": [{"resources": ["Topic:Other"], "actions": ["Pub"]}]}
    )
    assert asyncio.run(sync(moved, False)).action is user_sync.UserAction.UPDATE
    assert "Topic:Invoices" in send()

    assert asyncio.run(sync(granted, False)).action is user_sync.UserAction.UPDATE
    assert send() == ""

    async def delete() -> bool:
        admin = BrokerGroupAdmin(
            cluster.master().address, "t", ca_file=ca, credentials=operator_identity
        )
        try:
            return await admin.delete_user("billing-app")
        finally:
            await admin.close()

    assert asyncio.run(delete()) is True
    assert "billing-app" in send()  # unknown now: refused by name
    assert asyncio.run(delete()) is False


def test_source_addresses_are_judged_by_the_client_a_replica_passes_a_call_on_for(secure):
    """A slave passes a client's call to its master with the client's address, vouched for
    with the cluster's secret; the master judges the policy's source addresses by it, and
    refuses an address a caller claims without that proof."""
    cluster, ca, _ = secure
    cluster.master().create_topic("Sourced", queues=1)
    near = Credentials("near-app", "near-app-secret-key-0123456789ab")
    far = Credentials("far-app", "far-app-secret-key-0123456789abcd")
    with BlockingAdminClient(cluster.master().address, credentials=ADMIN, ca_file=ca) as admin:
        for keys, sources in ((near, ["127.0.0.1/32"]), (far, ["198.18.9.0/24"])):
            entry = apb.PolicyEntry(
                resources=["Topic:Sourced"], actions=["Get"], source_ips=sources
            )
            admin.create_user(
                apb.User(username=keys.access_key, secret_key=keys.secret_key, policy=[entry])
            )

    def describe(address: str, keys: Credentials | None, metadata: Any = ()) -> str:
        """'' when the topic was described, else the error."""
        try:
            with BlockingAdminClient(
                address, credentials=keys, metadata=tuple(metadata), ca_file=ca
            ) as client:
                client.describe_topic("Sourced")
        except ClientError as exc:
            return str(exc)
        return ""

    # Through the slave (which passes admin calls to the master): allowed at both.
    slave = cluster.slave().address
    wait_until(lambda: describe(slave, near) == "", 15, "the slave to hold the users")
    # The far user, from 127.0.0.1 itself: refused.
    master = cluster.master().address
    refusal = describe(master, far)
    assert "far-app may not" in refusal, refusal
    # Claiming an address of the far range: refused without the cluster's proof...
    signed = signed_metadata(far)
    date_time = dict(signed)[DATE_TIME]
    claim = [(FORWARDED_FOR, "198.18.9.7"), (FORWARDED_PROOF, "0" * 64)]
    refused = describe(master, None, [*signed, *claim])
    assert "without the cluster's proof" in refused, refused
    # ... and taken up with it (as a replica of the cluster would vouch for it).
    secret = "the-cluster-secret-of-this-test"
    proof = hmac.new(secret.encode(), f"198.18.9.7\n{date_time}".encode(), hashlib.sha256)
    vouched = [(FORWARDED_FOR, "198.18.9.7"), (FORWARDED_PROOF, proof.hexdigest())]
    assert describe(master, None, [*signed, *vouched]) == ""
