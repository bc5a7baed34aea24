"""What the operator asks cert-manager for (operator/cert_manager.py), and how it keeps the
trust bundle when cert-manager's CAs change."""

from __future__ import annotations

import datetime

import pytest

from capstan.common.errors import ConfigError
from capstan.operator import cert_manager as cm
from capstan.security.local_ca import new_ca_pem

NOW = datetime.datetime(2026, 11, 26, tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ("ClusterIssuer/vault", cm.IssuerRef("ClusterIssuer", "vault")),
        ("Issuer/team-ca.internal", cm.IssuerRef("Issuer", "team-ca.internal")),
    ],
)
def test_an_issuer_is_named_by_its_kind_and_name(text: str, wanted: cm.IssuerRef) -> None:
    assert cm.IssuerRef.parse(text) == wanted
    assert wanted.manifest()["group"] == "cert-manager.io"


@pytest.mark.parametrize("text", ["vault", "Secret/vault", "Issuer/", "Issuer/Upper", "Issuer/a b"])
def test_a_malformed_issuer_is_refused_naming_the_forms_it_may_take(text: str) -> None:
    with pytest.raises(ConfigError, match="Issuer/<name> or ClusterIssuer/<name>"):
        cm.IssuerRef.parse(text)


def test_a_server_certificate_asks_for_its_dns_names_and_ip_addresses_apart() -> None:
    issuer = cm.IssuerRef("ClusterIssuer", "corp")
    owner = {"apiVersion": "capstan.io/v1alpha1", "kind": "BrokerGroup", "name": "orders"}
    made = cm.server_certificate(
        "shop",
        "orders-tls",
        "orders",
        ["orders.shop.svc", "*.orders-brokers.shop.svc", "198.18.0.7", "2001:db8::1"],
        issuer,
        {"app": "capstan"},
        [owner],
    )
    spec = made["spec"]
    assert made["kind"] == "Certificate" and made["metadata"]["ownerReferences"] == [owner]
    assert spec["secretName"] == "orders-tls"
    assert spec["dnsNames"] == ["orders.shop.svc", "*.orders-brokers.shop.svc"]
    assert spec["ipAddresses"] == ["198.18.0.7", "2001:db8::1"]
    assert spec["issuerRef"] == {
        "group": "cert-manager.io",
        "kind": "ClusterIssuer",
        "name": "corp",
    }
    assert {"server auth", "client auth"} <= set(spec["usages"])
    assert spec["secretTemplate"]["labels"] == {"app": "capstan"}
    no_ip = cm.server_certificate("shop", "c", "c", ["c.shop.svc"], issuer, {}, [])
    assert "ipAddresses" not in no_ip["spec"]


def test_the_namespace_ca_is_a_self_signed_issuer_a_ca_certificate_and_a_ca_issuer() -> None:
    selfsigned, ca, ca_issuer = cm.namespace_ca("shop", {}, [])
    assert selfsigned["spec"] == {"selfSigned": {}}
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["issuerRef"]["name"] == selfsigned["metadata"]["name"]
    assert ca_issuer["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert cm.NAMESPACE_CA_ISSUER.name == ca_issuer["metadata"]["name"]


def test_readiness_is_the_ready_conditions_message() -> None:
    assert cm.not_ready_reason(None) == "the Certificate does not exist"
    assert "not looked at" in cm.not_ready_reason({"status": {}})
    pending = {
        "status": {
            "conditions": [{"type": "Ready", "status": "False", "message": 'Issuer "x" not found'}]
        }
    }
    assert cm.not_ready_reason(pending) == 'Issuer "x" not found'
    issued = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert cm.not_ready_reason(issued) == ""


def test_the_merged_bundle_keeps_each_live_ca_once_and_drops_expired_and_unreadable() -> None:
    old = new_ca_pem("old", days=30, now=NOW - datetime.timedelta(days=40)).certificate
    current = new_ca_pem("current", days=365, now=NOW).certificate
    following = new_ca_pem("following", days=365, now=NOW).certificate
    merged = cm.merged_bundle([current + old, b"not a pem", following, current], NOW)
    assert merged == current + following
    assert cm.merged_bundle([], NOW) == b""
