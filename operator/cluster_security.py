"""Puts a namespace's secrets (cluster_secrets.py) in place and keeps them current, and
gives the operator's own clients what they need to reach that namespace's cluster: the
trust bundle (as a file: gRPC's channel credentials read one) and the cluster's identity.

Secrets are read, decided on and written under one lock per namespace, so two groups of
a namespace reconciled at once never make two CAs. A secret's change is logged with its
reason, never with its content.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capstan.client.errors import TransportError
from capstan.common.durable_files import replace_durably
from capstan.operator import cert_manager as cm
from capstan.operator import cluster_secrets as cs
from capstan.operator.kube_objects import KubeObjects
from capstan.operator.manifests import names
from capstan.security.peers import CLUSTER_ACCESS_KEY
from capstan.security.signature import Credentials

log = logging.getLogger(__name__)

RENEW_INTERVAL_S = 60.0
"""How often the operator looks at each group's secrets (kopf timer): a certificate near its
expiry is issued again, a deleted secret made again."""
ACCESS_TTL_S = 60.0
"""How long the operator's clients go on with the trust bundle and identity they read
before reading them again (a renewed CA reaches them within this)."""


class SecretsNotReady(TransportError):
    """The namespace's secrets are not in place yet (its first BrokerGroup is being set
    up): a call to its cluster waits for them like one to a peer not up yet."""


class CertificatesUnavailable(Exception):
    """The servers' certificates cannot be in place yet; the handler tries again in
    `retry_s`, and the resource's status says why (the message)."""

    retry_s = 60.0
    reason = "CertificatesUnavailable"


class CertManagerMissing(CertificatesUnavailable):
    """The operator is to use cert-manager, whose CRDs the API server does not serve."""

    reason = "CertManagerMissing"


class CertificatesPending(CertificatesUnavailable):
    """cert-manager has not issued a certificate the namespace's pods need yet."""

    retry_s = 5.0
    reason = "CertificatesPending"


@dataclass(frozen=True)
class CertManagerIssuing:
    """Certificates from cert-manager (cert_manager.py), signed by `issuer`, or by a CA of
    each namespace's own that cert-manager makes when it is None."""

    issuer: cm.IssuerRef | None = None


@dataclass(frozen=True)
class NamespaceAccess:
    """How the operator reaches one namespace's secured cluster."""

    ca_file: Path
    """The trust bundle, as a file of the operator's own."""
    identity: Credentials
    """The cluster's identity (`capstan.cluster`), which the brokers take as a super user's
    and the controller as its own processes'."""
    bundle_digest: str
    """Names the trust bundle: clients made for another one are made again."""
    read_at: float = field(default_factory=time.monotonic)


class ClusterSecurity:
    def __init__(
        self, kube: KubeObjects, work_dir: Path, cert_manager: CertManagerIssuing | None = None
    ) -> None:
        """`work_dir`: where the operator keeps each namespace's trust bundle;
        `cert_manager`: the servers' certificates come from cert-manager, not from a CA
        the operator runs."""
        self._kube = kube
        self._work_dir = work_dir
        self._cert_manager = cert_manager
        self._cert_manager_seen = False
        self._locks: dict[str, asyncio.Lock] = {}
        self._access: dict[str, NamespaceAccess] = {}

    async def access(self, namespace: str) -> NamespaceAccess:
        """How to reach `namespace`'s cluster, read from its secrets (at most ACCESS_TTL_S
        old); SecretsNotReady while they are not in place."""
        known = self._access.get(namespace)
        if known is not None and time.monotonic() - known.read_at < ACCESS_TTL_S:
            return known
        now = datetime.datetime.now(datetime.UTC)
        cluster = (await self._read(namespace, cs.CLUSTER_SECRET)).get(cs.CLUSTER_SECRET_KEY)
        if self._cert_manager is None:
            ca = cs.ca_of(await self._read(namespace, cs.CA_SECRET))
            bundle = b"" if ca is None else ca.trust_bundle(now)
            trust_from = cs.CA_SECRET
        else:
            bundle = await self._issued_cas(namespace, now)
            trust_from = f"{cs.CONTROLLER_TLS_SECRET} from cert-manager"
        if not bundle or not cluster:
            raise SecretsNotReady(
                f"the secrets of namespace {namespace} ({trust_from}, {cs.CLUSTER_SECRET})"
                " are not in place yet"
            )
        return await self._keep_access(namespace, bundle, cluster.decode())

    async def ensure_namespace(
        self,
        namespace: str,
        owners: Sequence[Mapping[str, Any]],
        now: datetime.datetime | None = None,
    ) -> NamespaceAccess:
        """The CA, the cluster's secret, the admin's keys, the controller's certificate and
        the trust bundle of `namespace`, made or renewed as needed; `owners` (the
        namespace's BrokerGroups) own them, so they go with the last group.
        CertificatesUnavailable while cert-manager (when it issues) cannot or has not yet."""
        now = now or datetime.datetime.now(datetime.UTC)
        async with self._lock(namespace):
            labels = names.labels(names.CONTROLLER, "security")
            cluster = cs.cluster_secret_decision(await self._read(namespace, cs.CLUSTER_SECRET))
            await self._write(namespace, cs.CLUSTER_SECRET, cluster, labels, owners)
            admin = cs.admin_decision(await self._read(namespace, cs.ADMIN_SECRET))
            await self._write(namespace, cs.ADMIN_SECRET, admin, labels, owners)
            if self._cert_manager is None:
                bundle = await self._operator_ca_namespace(namespace, labels, owners, now)
                trusted = bundle
            else:
                trusted = await self._cert_manager_namespace(
                    namespace, self._cert_manager, labels, owners, now
                )
                held = await self._kube.get("v1", "ConfigMap", namespace, names.CA_BUNDLE)
                kept = ((held or {}).get("data") or {}).get(cs.CA_CERT, "").encode()
                # CAs seen before stay trusted until they expire (see cert_manager.py).
                bundle = cm.merged_bundle([trusted, kept], now)
            await self._kube.apply(cs.ca_bundle_config_map(namespace, bundle, labels, owners))
            return await self._keep_access(
                namespace, trusted, cluster.data[cs.CLUSTER_SECRET_KEY].decode()
            )

    async def _operator_ca_namespace(
        self,
        namespace: str,
        labels: Mapping[str, str],
        owners: Sequence[Mapping[str, Any]],
        now: datetime.datetime,
    ) -> bytes:
        """The operator's own CA and the controller's certificate; the trust bundle."""
        existing = await self._read(namespace, cs.CA_SECRET)
        ca, decision = cs.ca_decision(existing, namespace, now)
        await self._write(namespace, cs.CA_SECRET, decision, labels, owners)
        controller = cs.certificate_decision(
            await self._read(namespace, cs.CONTROLLER_TLS_SECRET),
            ca,
            names.CONTROLLER,
            cs.controller_hosts(namespace),
            now,
        )
        await self._write(namespace, cs.CONTROLLER_TLS_SECRET, controller, labels, owners)
        return ca.trust_bundle(now)

    async def _cert_manager_namespace(
        self,
        namespace: str,
        issuing: CertManagerIssuing,
        labels: Mapping[str, str],
        owners: Sequence[Mapping[str, Any]],
        now: datetime.datetime,
    ) -> bytes:
        """The namespace's CA (when cert-manager is to make one) and the controller's
        Certificate; the CAs that issued the certificates in place."""
        await self._require_cert_manager()
        issuer = issuing.issuer
        if issuer is None:
            for obj in cm.namespace_ca(namespace, labels, owners):
                await self._kube.apply(obj)
            issuer = cm.NAMESPACE_CA_ISSUER
        name = cs.CONTROLLER_TLS_SECRET
        hosts = cs.controller_hosts(namespace)
        await self._kube.apply(
            cm.server_certificate(namespace, name, names.CONTROLLER, hosts, issuer, labels, owners)
        )
        trusted = await self._issued_cas(namespace, now)
        if trusted:
            return trusted
        issued = await self._read(namespace, name)
        if issued.get(cs.TLS_CERT):
            raise CertificatesPending(
                f"cert-manager issued {namespace}/{name} without a ca.crt: the issuer"
                f" {issuer} must publish its CA (CA, self-signed and Vault issuers do)"
            )
        found = await self._kube.get(cm.API_VERSION, "Certificate", namespace, name)
        raise CertificatesPending(
            f"waiting for cert-manager to issue {namespace}/{name}: {cm.not_ready_reason(found)}"
        )

    async def _require_cert_manager(self) -> None:
        if self._cert_manager_seen:
            return
        served = await asyncio.to_thread(self._kube.has_api, cm.API_VERSION, "Certificate")
        if not served:
            raise CertManagerMissing(
                f"cert-manager is not installed: the API server does not serve"
                f" {cm.API_VERSION} Certificate. Install cert-manager, or let the operator"
                " run the CA (--cert-issuer operator; chart value"
                " operator.security.certificates.issuer=operator)"
            )
        self._cert_manager_seen = True

    async def _issued_cas(self, namespace: str, now: datetime.datetime) -> bytes:
        """The CAs named by the `ca.crt` of the certificates cert-manager issued in
        `namespace` (the namespace's CA when it made one, the controller's and the
        groups'), unexpired, each once."""
        groups = await self._kube.list_custom("brokergroups", namespace)
        secrets = [
            *([cm.CA_CERTIFICATE] if self._cert_manager and not self._cert_manager.issuer else []),
            cs.CONTROLLER_TLS_SECRET,
            *(cs.group_tls_secret(g["metadata"]["name"]) for g in groups),
        ]
        found = [(await self._read(namespace, s)).get(cs.CA_CERT, b"") for s in secrets]
        return cm.merged_bundle(found, now)

    async def certificate_problem(self, namespace: str, group: str) -> str:
        """Why cert-manager has not issued `group`'s certificate; "" when it has, or when
        the operator issues them itself."""
        if self._cert_manager is None:
            return ""
        name = cs.group_tls_secret(group)
        found = await self._kube.get(cm.API_VERSION, "Certificate", namespace, name)
        reason = cm.not_ready_reason(found)
        return f"the Certificate {namespace}/{name} is not issued: {reason}" if reason else ""

    async def ensure_group(
        self,
        namespace: str,
        group: str,
        owner: Mapping[str, Any],
        now: datetime.datetime | None = None,
        alternative_names: Sequence[str] = (),
    ) -> None:
        """The server certificate of `group`'s pods, for its Service's and pods' names and
        `alternative_names`, made or renewed as needed (after `ensure_namespace`, whose CA
        signs it)."""
        now = now or datetime.datetime.now(datetime.UTC)
        if self._cert_manager is not None:
            await self._require_cert_manager()
            issuer = self._cert_manager.issuer or cm.NAMESPACE_CA_ISSUER
            name = cs.group_tls_secret(group)
            hosts = [*cs.broker_hosts(group, namespace), *alternative_names]
            labels = names.labels(group, "security")
            await self._kube.apply(
                cm.server_certificate(namespace, name, group, hosts, issuer, labels, [owner])
            )
            return
        async with self._lock(namespace):
            ca_data = await self._read(namespace, cs.CA_SECRET)
            ca, decision = cs.ca_decision(ca_data, namespace, now)
            if decision.changed:  # pragma: no cover - ensure_namespace ran just before
                raise RuntimeError(f"the CA of {namespace} is not in place: {decision.reason}")
            name = cs.group_tls_secret(group)
            wanted = cs.certificate_decision(
                await self._read(namespace, name),
                ca,
                group,
                [*cs.broker_hosts(group, namespace), *alternative_names],
                now,
            )
            labels = names.labels(group, "security")
            await self._write(namespace, name, wanted, labels, [owner])

    def _lock(self, namespace: str) -> asyncio.Lock:
        return self._locks.setdefault(namespace, asyncio.Lock())

    async def _read(self, namespace: str, name: str) -> dict[str, bytes]:
        return cs.decoded(await self._kube.get("v1", "Secret", namespace, name))

    async def _write(
        self,
        namespace: str,
        name: str,
        decision: cs.Decision,
        labels: Mapping[str, str],
        owners: Sequence[Mapping[str, Any]],
    ) -> None:
        """Apply the secret: its data when it changed, and its owners either way (a group
        created later owns the namespace's secrets too)."""
        await self._kube.apply(cs.secret_manifest(namespace, name, decision.data, labels, owners))
        if decision.changed:
            log.info("%s/%s written: %s", namespace, name, decision.reason)

    async def _keep_access(self, namespace: str, bundle: bytes, secret: str) -> NamespaceAccess:
        digest = hashlib.sha256(bundle).hexdigest()[:16]
        ca_file = self._work_dir / namespace / f"ca-{digest}.crt"
        if not ca_file.exists():
            await asyncio.to_thread(_write_bundle, ca_file, bundle)
        access = NamespaceAccess(ca_file, Credentials(CLUSTER_ACCESS_KEY, secret), digest)
        self._access[namespace] = access
        return access


def _write_bundle(path: Path, bundle: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_durably(path, bundle)
