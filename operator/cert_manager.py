"""Servers' certificates from cert-manager (https://cert-manager.io) instead of the
operator's own CA (cluster_secrets.py): `capstan operator --cert-issuer cert-manager`.

The operator then writes cert-manager `Certificate` resources, one per BrokerGroup
(`<group>-tls`) and one for the controller (`capstan-controller-tls`), and cert-manager
issues them into Secrets of the same names (`tls.crt`, `tls.key`, `ca.crt`) and renews them
before they expire. The issuer is one the user names (`Issuer/<name>` or
`ClusterIssuer/<name>`), or else a CA of the namespace's own that cert-manager makes and
keeps: a self-signed Issuer signs the CA's Certificate, and a CA Issuer signs with it.

Pods trust the namespace's trust bundle (the ConfigMap `capstan-ca-bundle`), not the `ca.crt`
of their own Secret: the operator merges into it every issuing CA it sees in the
certificates' Secrets and keeps each until it expires, so when cert-manager's CA is
replaced, peers still holding certificates from the old one are not refused while theirs
wait for renewal.

The cluster's secret and the admin's keys are not certificates: the operator makes them
in either mode. The functions here build and decide; cluster_security.py applies.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from capstan.common.errors import ConfigError
from capstan.operator.cluster_secrets import CERT_DAYS, CERT_RENEW_BEFORE

API_VERSION = "cert-manager.io/v1"
GROUP = "cert-manager.io"
ISSUER_KINDS = ("Issuer", "ClusterIssuer")

SELF_SIGNED_ISSUER = "capstan-selfsigned"
"""The namespace's self-signed Issuer, which signs its CA's certificate alone."""
CA_CERTIFICATE = "capstan-cert-manager-ca"
"""The namespace's CA, as a Certificate and the Secret cert-manager writes it to (a name
apart from the operator's own `capstan-ca`, so switching issuers never mixes the two)."""
CA_ISSUER = "capstan-ca"
"""The namespace's CA Issuer, which signs the servers' certificates."""
CA_DAYS = 5 * 365
CA_RENEW_BEFORE_DAYS = 180


_RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class IssuerRef:
    """The cert-manager issuer that signs the servers' certificates."""

    kind: str
    name: str

    @classmethod
    def parse(cls, text: str) -> IssuerRef:
        """`Issuer/<name>` (in each namespace with BrokerGroups) or `ClusterIssuer/<name>`."""
        kind, slash, name = text.partition("/")
        named = len(name) <= 253 and _RESOURCE_NAME.fullmatch(name) is not None
        if not slash or kind not in ISSUER_KINDS or not named:
            raise ConfigError(
                f"the cert-manager issuer {text!r} is not Issuer/<name> or ClusterIssuer/<name>"
            )
        return cls(kind, name)

    def manifest(self) -> dict[str, str]:
        return {"group": GROUP, "kind": self.kind, "name": self.name}

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


NAMESPACE_CA_ISSUER = IssuerRef("Issuer", CA_ISSUER)


def _hours(days: int) -> str:
    return f"{days * 24}h"


def _metadata(
    namespace: str, name: str, labels: Mapping[str, str], owners: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": dict(labels),
        "ownerReferences": [dict(o) for o in owners],
    }


def namespace_ca(
    namespace: str, labels: Mapping[str, str], owners: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The namespace's own CA through cert-manager: the self-signed Issuer, the CA's
    Certificate it signs, and the CA Issuer that signs with it."""
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "Issuer",
            "metadata": _metadata(namespace, SELF_SIGNED_ISSUER, labels, owners),
            "spec": {"selfSigned": {}},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "Certificate",
            "metadata": _metadata(namespace, CA_CERTIFICATE, labels, owners),
            "spec": {
                "isCA": True,
                "commonName": f"Capstan CA {namespace}",
                "secretName": CA_CERTIFICATE,
                "duration": _hours(CA_DAYS),
                "renewBefore": _hours(CA_RENEW_BEFORE_DAYS),
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                "issuerRef": IssuerRef("Issuer", SELF_SIGNED_ISSUER).manifest(),
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": "Issuer",
            "metadata": _metadata(namespace, CA_ISSUER, labels, owners),
            "spec": {"ca": {"secretName": CA_CERTIFICATE}},
        },
    ]


def server_certificate(
    namespace: str,
    name: str,
    common_name: str,
    hosts: Sequence[str],
    issuer: IssuerRef,
    labels: Mapping[str, str],
    owners: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """A Certificate for a server's `hosts` (DNS names and IP addresses), issued into the
    Secret `name`, as long-lived and renewed as early as the operator's own."""
    dns, ips = [], []
    for host in hosts:
        try:
            ips.append(str(ipaddress.ip_address(host)))
        except ValueError:
            dns.append(host)
    spec: dict[str, Any] = {
        "secretName": name,
        "secretTemplate": {"labels": dict(labels)},
        "commonName": common_name,
        "dnsNames": dns,
        "duration": _hours(CERT_DAYS),
        "renewBefore": _hours(CERT_RENEW_BEFORE.days),
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        # Servers and, for the peers they dial, clients of each other.
        "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
        "issuerRef": issuer.manifest(),
    }
    if ips:
        spec["ipAddresses"] = ips
    return {
        "apiVersion": API_VERSION,
        "kind": "Certificate",
        "metadata": _metadata(namespace, name, labels, owners),
        "spec": spec,
    }


def not_ready_reason(certificate: Mapping[str, Any] | None) -> str:
    """Why cert-manager has not issued `certificate` (its Ready condition's message); ""
    once it has."""
    if certificate is None:
        return "the Certificate does not exist"
    for c in (certificate.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            if c.get("status") == "True":
                return ""
            return str(c.get("message") or c.get("reason") or "not ready")
    return "cert-manager has not looked at it yet"


def merged_bundle(parts: Iterable[bytes], now: datetime.datetime) -> bytes:
    """The certificates of every PEM in `parts`, each once, in the order first seen,
    without those expired at `now` or unreadable."""
    seen: set[bytes] = set()
    out: list[bytes] = []
    for part in parts:
        try:
            certificates = x509.load_pem_x509_certificates(part)
        except ValueError:
            continue
        for certificate in certificates:
            der = certificate.public_bytes(serialization.Encoding.DER)
            if der in seen or certificate.not_valid_after_utc <= now:
                continue
            seen.add(der)
            out.append(certificate.public_bytes(serialization.Encoding.PEM))
    return b"".join(out)
