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
    def __init__(self, kube: KubeObjects, work_dir: Path) -> None:
        """`work_dir`: where the operator keeps each namespace's trust bundle."""
        self._kube = kube
        self._work_dir = work_dir
        self._locks: dict[str, asyncio.Lock] = {}
        self._access: dict[str, NamespaceAccess] = {}

    async def access(self, namespace: str) -> NamespaceAccess:
        """How to reach `namespace`'s cluster, read from its secrets (at most ACCESS_TTL_S
        old); SecretsNotReady while they are not in place."""
        known = self._access.get(namespace)
        if known is not None and time.monotonic() - known.read_at < ACCESS_TTL_S:
            return known
        ca = cs.ca_of(await self._read(namespace, cs.CA_SECRET))
        cluster = (await self._read(namespace, cs.CLUSTER_SECRET)).get(cs.CLUSTER_SECRET_KEY)
        if ca is None or not cluster:
            raise SecretsNotReady(
                f"the secrets of namespace {namespace} ({cs.CA_SECRET}, {cs.CLUSTER_SECRET})"
                " are not in place yet"
            )
        now = datetime.datetime.now(datetime.UTC)
        return await self._keep_access(namespace, ca.trust_bundle(now), cluster.decode())

    async def ensure_namespace(
        self,
        namespace: str,
        owners: Sequence[Mapping[str, Any]],
        now: datetime.datetime | None = None,
    ) -> NamespaceAccess:
        """The CA, the cluster's secret, the admin's keys and the controller's certificate
        of `namespace`, made or renewed as needed; `owners` (the namespace's BrokerGroups)
        own them, so they go with the last group."""
        now = now or datetime.datetime.now(datetime.UTC)
        async with self._lock(namespace):
            labels = names.labels(names.CONTROLLER, "security")
            existing = await self._read(namespace, cs.CA_SECRET)
            ca, decision = cs.ca_decision(existing, namespace, now)
            await self._write(namespace, cs.CA_SECRET, decision, labels, owners)
            cluster = cs.cluster_secret_decision(await self._read(namespace, cs.CLUSTER_SECRET))
            await self._write(namespace, cs.CLUSTER_SECRET, cluster, labels, owners)
            admin = cs.admin_decision(await self._read(namespace, cs.ADMIN_SECRET))
            await self._write(namespace, cs.ADMIN_SECRET, admin, labels, owners)
            controller = cs.certificate_decision(
                await self._read(namespace, cs.CONTROLLER_TLS_SECRET),
                ca,
                names.CONTROLLER,
                cs.controller_hosts(namespace),
                now,
            )
            await self._write(namespace, cs.CONTROLLER_TLS_SECRET, controller, labels, owners)
            bundle = ca.trust_bundle(now)
            await self._kube.apply(cs.ca_bundle_config_map(namespace, bundle, labels, owners))
            return await self._keep_access(
                namespace, bundle, cluster.data[cs.CLUSTER_SECRET_KEY].decode()
            )

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
