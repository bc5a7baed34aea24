"""The secrets a namespace's Capstan cluster runs on, which the operator makes and renews.

- `capstan-ca`: the namespace's own CA (EC P-256; `ca.crt`, `ca.key`). It is replaced
  `CA_RENEW_BEFORE` its expiry; the replaced CA stays trusted (`previous-ca.crt`) until it
  expires, so a peer still holding a certificate it signed is not refused meanwhile.
- `capstan-cluster`: the cluster's secret (`cluster-secret`). Brokers, controllers and the
  operator sign their calls to each other with it (capstan/security/peers.py); replication
  and the controller's broker-facing calls admit nobody else.
- `capstan-admin`: a super user's keys (`admin-credentials.json`, and `access-key` and
  `secret-key`), which every broker creates at start: for people, the CLI and the Spark
  jobs.
- `capstan-ca-bundle` (a ConfigMap): the trust bundle alone, for any client to mount.
- `<group>-tls` per BrokerGroup and `capstan-controller-tls`: the server certificate of
  those pods (`tls.crt`, `tls.key`) for their Services' and pods' DNS names, and the trust
  bundle (`ca.crt`: the CA and the replaced one). Reissued `CERT_RENEW_BEFORE` expiry, when
  the CA changed, or when the names it must cover changed. The kubelet brings the new files
  into the pods; brokers and controllers take them up without a restart (security/tls.py).

The functions here decide and build; the handlers (cluster_security.py) read and apply.
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capstan.common.errors import ConfigError
from capstan.operator.manifests import names
from capstan.security.local_ca import (
    PemPair,
    issue_pem,
    new_ca_pem,
    read_certificate,
    signed_by,
)
from capstan.security.tls import key_matches

CA_SECRET = names.CA_SECRET
CLUSTER_SECRET = names.CLUSTER_SECRET
ADMIN_SECRET = names.ADMIN_SECRET
CONTROLLER_TLS_SECRET = names.CONTROLLER_TLS_SECRET

CA_DAYS = 5 * 365
CA_RENEW_BEFORE = datetime.timedelta(days=180)
CERT_DAYS = 90
CERT_RENEW_BEFORE = datetime.timedelta(days=30)

ADMIN_USER = "capstan-admin"
CLUSTER_SECRET_KEY = names.CLUSTER_SECRET_KEY
ADMIN_CREDENTIALS_KEY = names.ADMIN_CREDENTIALS_KEY
CA_KEY, CA_CERT, PREVIOUS_CA_CERT = "ca.key", names.CA_CERT_KEY, "previous-ca.crt"
TLS_CERT, TLS_KEY = names.TLS_CERT_KEY, names.TLS_KEY_KEY
group_tls_secret = names.group_tls_secret


def decoded(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    """A Secret's data, decoded; {} for no Secret (or one without data)."""
    data = (secret or {}).get("data") or {}
    out: dict[str, bytes] = {}
    for key, value in data.items():
        try:
            out[key] = base64.b64decode(value or "", validate=True)
        except ValueError:
            out[key] = b""  # unreadable: treated as missing
    return out


def secret_manifest(
    namespace: str,
    name: str,
    data: Mapping[str, bytes],
    labels: Mapping[str, str],
    owners: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "ownerReferences": [dict(o) for o in owners],
        },
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


# -- the CA -----------------------------------------------------------------------------


@dataclass(frozen=True)
class NamespaceCa:
    current: PemPair
    previous_certificate: bytes = b""

    def trust_bundle(self, now: datetime.datetime) -> bytes:
        """The certificates peers are checked against: the CA, and the one it replaced
        while that one has not expired."""
        bundle = self.current.certificate
        if self.previous_certificate and _valid_at(self.previous_certificate, now):
            bundle += self.previous_certificate
        return bundle

    def data(self) -> dict[str, bytes]:
        out = {CA_CERT: self.current.certificate, CA_KEY: self.current.key}
        if self.previous_certificate:
            out[PREVIOUS_CA_CERT] = self.previous_certificate
        return out


@dataclass(frozen=True)
class Decision:
    """What to do with one secret: keep it, or write `data` (and why)."""

    data: dict[str, bytes]
    reason: str = ""
    """Empty: keep the secret as it is."""

    @property
    def changed(self) -> bool:
        return bool(self.reason)


def ca_decision(
    existing: Mapping[str, bytes], namespace: str, now: datetime.datetime
) -> tuple[NamespaceCa, Decision]:
    """The namespace's CA: the one `existing` holds while it is sound and far from expiry,
    else a new one (the old one kept as previous while it is valid)."""
    found = ca_of(existing)
    reason = ""
    if found is None:
        reason = "no CA yet" if not existing else "the CA secret is unreadable"
    else:
        facts = read_certificate(found.current.certificate)
        if facts.not_after - now <= CA_RENEW_BEFORE:
            reason = f"the CA expires at {facts.not_after:%Y-%m-%d}"
    if not reason:
        assert found is not None
        return found, Decision(found.data())
    previous = b""
    if found is not None and _valid_at(found.current.certificate, now):
        previous = found.current.certificate
    made = NamespaceCa(new_ca_pem(f"Capstan CA of namespace {namespace}", CA_DAYS, now), previous)
    return made, Decision(made.data(), reason)


def ca_of(data: Mapping[str, bytes]) -> NamespaceCa | None:
    cert, key = data.get(CA_CERT, b""), data.get(CA_KEY, b"")
    if not cert or not key:
        return None
    try:
        if not read_certificate(cert).is_ca or not key_matches(key, cert):
            return None
    except (ValueError, ConfigError):
        return None
    return NamespaceCa(PemPair(cert, key), data.get(PREVIOUS_CA_CERT, b""))


def _valid_at(certificate: bytes, now: datetime.datetime) -> bool:
    try:
        facts = read_certificate(certificate)
    except ValueError:
        return False
    return facts.not_before <= now < facts.not_after


# -- server certificates ----------------------------------------------------------------


def broker_hosts(group: str, namespace: str) -> list[str]:
    """The names a BrokerGroup's pods answer to: its client Service, and each pod under
    its headless Service (names.pod_host)."""
    headless = names.headless_service(group)
    return _with_cluster_domain([f"{group}.{namespace}.svc", f"*.{headless}.{namespace}.svc"])


def controller_hosts(namespace: str) -> list[str]:
    service = names.CONTROLLER
    return _with_cluster_domain([f"{service}.{namespace}.svc", f"*.{service}.{namespace}.svc"])


def _with_cluster_domain(hosts: list[str]) -> list[str]:
    return [*hosts, *(f"{h}.cluster.local" for h in hosts)]


def certificate_decision(
    existing: Mapping[str, bytes],
    ca: NamespaceCa,
    common_name: str,
    hosts: Sequence[str],
    now: datetime.datetime,
) -> Decision:
    """The server certificate for `hosts`: the one `existing` holds while the CA signed
    it, it covers exactly `hosts` and is far from expiry; else a new one. The trust bundle
    is brought up to date either way."""
    bundle = ca.trust_bundle(now)
    cert, key = existing.get(TLS_CERT, b""), existing.get(TLS_KEY, b"")
    reason = _reissue_reason(cert, key, ca, hosts, now)
    if reason:
        issued = issue_pem(ca.current, common_name, hosts, CERT_DAYS, now)
        cert, key = issued.certificate, issued.key
    data = {TLS_CERT: cert, TLS_KEY: key, CA_CERT: bundle}
    if not reason and existing.get(CA_CERT) != bundle:
        reason = "the trust bundle changed"
    return Decision(data, reason)


def _reissue_reason(
    cert: bytes, key: bytes, ca: NamespaceCa, hosts: Sequence[str], now: datetime.datetime
) -> str:
    if not cert or not key:
        return "no certificate yet"
    try:
        facts = read_certificate(cert)
    except ValueError:
        return "the certificate is unreadable"
    if not signed_by(cert, ca.current.certificate):
        return "the CA changed"
    if facts.hosts != frozenset(hosts):
        return "the names it must cover changed"
    if facts.not_after - now <= CERT_RENEW_BEFORE:
        return f"the certificate expires at {facts.not_after:%Y-%m-%d}"
    return ""


# -- the cluster's secret and the admin's keys ------------------------------------------


def cluster_secret_decision(existing: Mapping[str, bytes]) -> Decision:
    """The cluster's secret, made once and kept (every process of the cluster holds it)."""
    value = existing.get(CLUSTER_SECRET_KEY, b"").strip()
    if len(value) >= 32:
        return Decision({CLUSTER_SECRET_KEY: value})
    return Decision({CLUSTER_SECRET_KEY: _random_key().encode()}, "no cluster secret yet")


def admin_decision(existing: Mapping[str, bytes]) -> Decision:
    """The super user's keys, made once and kept: as a credentials file (the brokers'
    `auth.init_user_file`) and one key per entry (for clients' environment variables)."""
    try:
        keys = json.loads(existing.get(ADMIN_CREDENTIALS_KEY, b"") or b"null")
    except ValueError:
        keys = None
    reason = ""
    if not (isinstance(keys, dict) and keys.get("access_key") and keys.get("secret_key")):
        keys = {"access_key": ADMIN_USER, "secret_key": _random_key()}
        reason = "no admin keys yet"
    data = {
        ADMIN_CREDENTIALS_KEY: json.dumps(
            {"access_key": keys["access_key"], "secret_key": keys["secret_key"]}
        ).encode(),
        names.ACCESS_KEY_KEY: str(keys["access_key"]).encode(),
        names.SECRET_KEY_KEY: str(keys["secret_key"]).encode(),
    }
    if not reason and any(existing.get(k) != v for k, v in data.items()):
        reason = "the admin keys' entries were incomplete"
    return Decision(data, reason)


def ca_bundle_config_map(
    namespace: str, bundle: bytes, labels: Mapping[str, str], owners: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The trust bundle alone, public: any client of the namespace mounts it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": names.CA_BUNDLE,
            "namespace": namespace,
            "labels": dict(labels),
            "ownerReferences": [dict(o) for o in owners],
        },
        "data": {CA_CERT: bundle.decode()},
    }


def _random_key() -> str:
    return secrets.token_urlsafe(32)
