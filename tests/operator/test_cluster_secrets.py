"""The namespace's CA, certificates, cluster secret and admin keys the operator makes and
renews (operator/cluster_secrets.py), with a clock moved by hand, and a real TLS handshake
with what it issues."""

from __future__ import annotations

import base64
import datetime
import json
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from capstan.operator import cluster_secrets as cs
from capstan.security.local_ca import new_ca_pem, read_certificate, signed_by

NOW = datetime.datetime(2026, 11, 26, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)
HOSTS = cs.broker_hosts("orders", "shop")


def first_ca(now: datetime.datetime = NOW) -> cs.NamespaceCa:
    ca, decision = cs.ca_decision({}, "shop", now)
    assert decision.changed and decision.reason == "no CA yet"
    return ca


def test_a_new_namespace_gets_a_ca_and_keeps_it_until_near_its_expiry() -> None:
    ca, decision = cs.ca_decision({}, "shop", NOW)
    facts = read_certificate(ca.current.certificate)
    assert facts.is_ca and "shop" in facts.subject
    kept, again = cs.ca_decision(decision.data, "shop", NOW + 100 * DAY)
    assert not again.changed and kept.current == ca.current

    late = facts.not_after - cs.CA_RENEW_BEFORE + DAY
    renewed, decision = cs.ca_decision(decision.data, "shop", late)
    assert decision.changed and "expires" in decision.reason
    assert renewed.current != ca.current
    # The replaced CA stays trusted until it expires, then drops out of the bundle.
    assert renewed.previous_certificate == ca.current.certificate
    assert ca.current.certificate in renewed.trust_bundle(late)
    assert renewed.trust_bundle(facts.not_after + DAY) == renewed.current.certificate


@pytest.mark.parametrize(
    "damage",
    [
        {cs.CA_CERT: b"not a certificate", cs.CA_KEY: b"nor a key"},
        {cs.CA_KEY: b""},
        "another key",
    ],
    ids=["garbage", "no key", "a key of another CA"],
)
def test_an_unreadable_ca_secret_is_replaced(damage: object) -> None:
    data = first_ca().data()
    if damage == "another key":
        data[cs.CA_KEY] = new_ca_pem().key
    else:
        assert isinstance(damage, dict)
        data.update(damage)
    _, decision = cs.ca_decision(data, "shop", NOW)
    assert decision.changed and decision.reason == "the CA secret is unreadable"


def test_a_server_certificate_covers_the_groups_names_and_is_renewed_before_it_expires() -> None:
    ca = first_ca()
    made = cs.certificate_decision({}, ca, "orders", HOSTS, NOW)
    assert made.reason == "no certificate yet"
    cert = made.data[cs.TLS_CERT]
    facts = read_certificate(cert)
    assert "*.orders-brokers.shop.svc" in facts.hosts and "orders.shop.svc" in facts.hosts
    assert signed_by(cert, ca.current.certificate)
    assert made.data[cs.CA_CERT] == ca.current.certificate

    assert not cs.certificate_decision(made.data, ca, "orders", HOSTS, NOW + 30 * DAY).changed
    late = facts.not_after - cs.CERT_RENEW_BEFORE + DAY
    renewed = cs.certificate_decision(made.data, ca, "orders", HOSTS, late)
    assert "expires" in renewed.reason
    assert read_certificate(renewed.data[cs.TLS_CERT]).not_after > facts.not_after

    other_hosts = cs.broker_hosts("payments", "shop")
    moved = cs.certificate_decision(made.data, ca, "orders", other_hosts, NOW)
    assert moved.reason == "the names it must cover changed"


def test_a_renewed_ca_reissues_the_certificates_and_trusts_both_meanwhile() -> None:
    ca = first_ca()
    made = cs.certificate_decision({}, ca, "orders", HOSTS, NOW)
    late = read_certificate(ca.current.certificate).not_after - cs.CA_RENEW_BEFORE + DAY
    renewed, _ = cs.ca_decision(ca.data(), "shop", late)
    again = cs.certificate_decision(made.data, renewed, "orders", HOSTS, late)
    assert again.reason == "the CA changed"
    assert signed_by(again.data[cs.TLS_CERT], renewed.current.certificate)
    bundle = again.data[cs.CA_CERT]
    assert ca.current.certificate in bundle and renewed.current.certificate in bundle


def test_the_cluster_secret_and_the_admin_keys_are_made_once_and_kept() -> None:
    cluster = cs.cluster_secret_decision({})
    assert cluster.changed and len(cluster.data[cs.CLUSTER_SECRET_KEY]) >= 32
    assert not cs.cluster_secret_decision(cluster.data).changed
    assert cs.cluster_secret_decision({cs.CLUSTER_SECRET_KEY: b"short"}).changed

    admin = cs.admin_decision({})
    keys = json.loads(admin.data[cs.ADMIN_CREDENTIALS_KEY])
    assert keys["access_key"] == cs.ADMIN_USER and len(keys["secret_key"]) >= 32
    assert admin.data["access-key"] == cs.ADMIN_USER.encode()
    assert admin.data["secret-key"] == keys["secret_key"].encode()
    assert not cs.admin_decision(admin.data).changed
    assert cs.admin_decision({cs.ADMIN_CREDENTIALS_KEY: b"{broken"}).changed
    # A secret edited down to the file alone gets its entries back, with the same keys.
    completed = cs.admin_decision({cs.ADMIN_CREDENTIALS_KEY: admin.data[cs.ADMIN_CREDENTIALS_KEY]})
    assert completed.changed and completed.data == admin.data
    assert cs.cluster_secret_decision({}).data != cluster.data  # each namespace its own


def test_a_secret_manifest_round_trips_its_data() -> None:
    data = {"a": b"\x00\x01binary", "b": b"text"}
    manifest = cs.secret_manifest("shop", "x", data, {"l": "v"}, [])
    assert manifest["kind"] == "Secret" and manifest["metadata"]["namespace"] == "shop"
    assert cs.decoded(manifest) == data
    assert cs.decoded(None) == {}
    assert cs.decoded({"data": {"bad": "!!not base64"}}) == {"bad": b""}
    assert base64.b64decode(manifest["data"]["b"]) == b"text"


def test_a_client_trusting_the_bundle_reaches_a_pod_by_its_dns_name_and_no_other() -> None:
    """gRPC's own TLS checks the wildcard name of a pod under the headless Service."""
    ca = first_ca()
    made = cs.certificate_decision({}, ca, "orders", HOSTS, datetime.datetime.now(datetime.UTC))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    credentials = grpc.ssl_server_credentials([(made.data[cs.TLS_KEY], made.data[cs.TLS_CERT])])
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:

        def check(name: str) -> grpc.StatusCode:
            channel = grpc.secure_channel(
                f"127.0.0.1:{port}",
                grpc.ssl_channel_credentials(made.data[cs.CA_CERT]),
                options=[("grpc.ssl_target_name_override", name)],
            )
            with channel:
                try:
                    health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(), timeout=5
                    )
                except grpc.RpcError as exc:
                    return exc.code()  # type: ignore[no-any-return]
                return grpc.StatusCode.OK

        assert check("orders-1.orders-brokers.shop.svc") is grpc.StatusCode.OK
        assert check("orders.shop.svc.cluster.local") is grpc.StatusCode.OK
        assert check("orders-1.orders-brokers.other.svc") is grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None)
