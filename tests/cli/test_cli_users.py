"""`capstan user` and `capstan acl` against a controller and a master + slave group with
authentication on: users made and changed through the CLI take effect at once, on every
replica, and nothing ever prints a secret key but the one made up for a new user."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from capstan.client.admin import BlockingAdminClient
from capstan.security.peers import CLUSTER_ACCESS_KEY as CLUSTER
from capstan.security.signature import Credentials, signed_metadata
from capstan.v1 import controller_pb2 as cpb
from capstan.v1 import controller_pb2_grpc as cpb_grpc
from tests.broker.replication.test_controlled_group import (
    GROUP,
    Cluster,
    start_cluster,
    stop_cluster,
)
from tests.cli.test_broker_cli import capstan
from tests.waiting import wait_until

ADMIN = Credentials("root", "root-secret-1")
FORWARDED = (("x-capstan-forwarded", "1"),)  # answered by the replica asked, not its master


def capstan_as(keys: Credentials | None, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI signing as `keys` (given through the environment), or unsigned."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPSTAN_")}
    if keys is not None:
        env.update(CAPSTAN_ACCESS_KEY=keys.access_key, CAPSTAN_SECRET_KEY=keys.secret_key)
    return capstan(*args, env=env)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, list[str]]]:
    root = tmp_path_factory.mktemp("users")
    keys = root / "admin-credentials.json"
    keys.write_text(json.dumps({"access_key": "root", "secret_key": "root-secret-1"}))
    secret = root / "cluster-secret"
    secret.write_text("the-cluster-secret-of-this-test")
    auth = {"enabled": True, "init_user_file": str(keys), "cluster_secret_file": str(secret)}
    controller_auth = {"enabled": True, "cluster_secret_file": str(secret)}
    cluster = start_cluster(
        root, controller={"auth": controller_auth}, broker={"credentials": ADMIN, "auth": auth}
    )
    try:
        wait_until(lambda: cluster.settled(2), 20, "a master with its slave in sync")
        for topic in ("orders", "payments"):
            cluster.master().create_topic(topic)  # signed as root
        yield cluster, ["--server", f"127.0.0.1:{cluster.controller.port}"]
    finally:
        stop_cluster(cluster)


def as_root(server: list[str], *args: str) -> dict[str, Any]:
    done = capstan_as(ADMIN, *args, *server, "--json")
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def test_users_and_acls_made_with_the_cli_hold_at_once_on_every_replica(secured):
    cluster, server = secured
    made = as_root(server, "user", "create", "alice")
    secret = made["secret_key"]
    assert made["username"] == "alice" and made["user_type"] == "Normal" and len(secret) >= 32
    alice = Credentials("alice", secret)

    def produce(topic: str) -> subprocess.CompletedProcess[str]:
        return capstan_as(alice, "produce", topic, "--body", "hi", *server, "--json")

    refused = produce("orders")
    assert refused.returncode != 0 and "alice may not" in refused.stderr + refused.stdout
    entry = as_root(
        server, "acl", "create", "alice", "--resource", "Topic:orders", "--action", "Pub"
    )
    assert entry["policy"] == [
        {"resources": ["Topic:orders"], "actions": ["Pub"], "decision": "Allow", "source_ips": []}
    ]
    assert produce("orders").returncode == 0, produce("orders").stderr
    elsewhere = produce("payments")
    assert elsewhere.returncode != 0
    assert "Topic:payments" in elsewhere.stderr + elsewhere.stdout

    # The slave holds the user and its policy, for the day it is promoted.
    slave = cluster.slave()
    with BlockingAdminClient(slave.address, metadata=FORWARDED, credentials=ADMIN) as admin:

        def on_slave() -> list[str]:
            return [r for e in admin.get_user("alice").user.policy for r in e.resources]

        wait_until(lambda: on_slave() == ["Topic:orders"], 10, "alice's policy on the slave")

    # Taking the grant away ends it without a restart.
    as_root(server, "acl", "delete", "alice", "--resource", "Topic:orders")
    assert produce("orders").returncode != 0

    listed = as_root(server, "user", "list")
    assert {u["username"] for u in listed["users"]} == {"root", "alice"}
    assert all("secret_key" not in u for u in listed["users"])
    shown = capstan_as(ADMIN, "user", "list", *server).stdout + json.dumps(listed)
    assert secret not in shown and "root-secret-1" not in shown


def test_a_disabled_user_is_refused_and_a_normal_user_may_not_manage_users(secured):
    _, server = secured
    as_root(server, "user", "create", "bob", "--user-secret", "bob-secret-1")
    as_root(server, "acl", "create", "bob", "--resource", "Topic:*", "--action", "Pub,Sub")
    bob = Credentials("bob", "bob-secret-1")
    assert capstan_as(bob, "produce", "orders", "--body", "x", *server).returncode == 0
    manage = capstan_as(bob, "user", "list", *server)
    assert manage.returncode != 0 and "super users" in manage.stderr
    as_root(server, "user", "update", "bob", "--status", "disable")
    disabled = capstan_as(bob, "produce", "orders", "--body", "x", *server)
    assert disabled.returncode != 0 and "disabled" in disabled.stderr + disabled.stdout
    gone = capstan_as(None, "user", "list", *server)
    assert gone.returncode != 0 and "not signed" in gone.stderr


def test_bad_acl_input_is_refused_with_what_is_wrong(secured):
    _, server = secured
    as_root(server, "user", "create", "carol", "--user-secret", "carol-secret-1")
    bad = capstan_as(
        ADMIN, "acl", "create", "carol", "--resource", "Queue:x", "--action", "Pub", *server
    )
    assert bad.returncode != 0 and "resource type must be one of" in bad.stderr
    missing = capstan_as(ADMIN, "user", "get", "nobody", *server)
    assert missing.returncode != 0 and "no user 'nobody'" in missing.stderr
    short = capstan_as(ADMIN, "user", "update", "carol", "--user-secret", "abc", *server)
    assert short.returncode != 0 and "6 to 256" in short.stderr
    half = capstan_as(None, "user", "list", "--access-key", "root", *server)
    assert half.returncode != 0 and "secret key" in half.stderr


def test_the_cli_signs_with_the_keys_of_a_credentials_file(secured, tmp_path):
    _, server = secured
    as_root(server, "user", "create", "dave", "--user-secret", "dave-secret-1")
    as_root(server, "acl", "create", "dave", "--resource", "Topic:orders", "--action", "Pub")
    dave = tmp_path / "dave.json"
    dave.write_text(json.dumps({"access_key": "dave", "secret_key": "dave-secret-1"}))
    send = ("produce", "orders", "--body", "hi", *server, "--json")
    by_flag = capstan_as(None, *send, "--credentials", str(dave))
    assert by_flag.returncode == 0, by_flag.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAPSTAN_")}
    by_env = capstan(*send, env={**env, "CAPSTAN_CREDENTIALS": str(dave)})
    assert by_env.returncode == 0, by_env.stderr
    refused = capstan_as(
        None, "produce", "payments", "--body", "hi", *server, "--credentials", str(dave)
    )
    assert refused.returncode != 0 and "dave may not Pub|Sub on Topic:payments" in refused.stderr
    # Keys given as flags come before the file; a file that holds no keys is named.
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"access_key": "dave"}))
    told = capstan_as(None, *send, "--credentials", str(wrong))
    assert told.returncode != 0 and f"the credentials file {wrong} needs" in told.stderr
    assert "dave-secret-1" not in told.stderr


def test_only_the_cluster_may_register_brokers_or_move_masters(secured):
    """The group above formed through a controller that admits only the cluster's
    signature for its changes; anyone may read the cluster's shape."""
    cluster, server = secured
    stub = cpb_grpc.ControllerStub(grpc.insecure_channel(f"127.0.0.1:{cluster.controller.port}"))
    elect = cpb.ElectMasterRequest(group=GROUP, preferred_broker_id=1)
    for metadata in (
        [],
        signed_metadata(ADMIN),
        signed_metadata(Credentials(CLUSTER, "guess-it-1")),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            stub.ElectMaster(elect, metadata=metadata, timeout=5)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "for the cluster's own processes" in refused.value.details()
    # Each refusal is counted by its reason, as the brokers count theirs.
    url = f"http://127.0.0.1:{cluster.controller.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
    counted = {
        s.labels["reason"]: s.value
        for s in families["capstan_auth_failures"].samples
        if s.name == "capstan_auth_failures_total"
    }
    assert counted["missing"] >= 1 and counted["unknown_user"] >= 1  # the admin: no cluster
    assert counted["wrong_signature"] >= 1 and counted["expired"] == 0
    status = capstan_as(None, "cluster", "status", *server, "--json")
    assert status.returncode == 0 and GROUP in status.stdout
