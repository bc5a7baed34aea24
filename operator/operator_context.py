"""What every handler of the operator shares: the Kubernetes client, the cluster's facts,
the metrics, and one client per namespace's controller and per broker group."""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capstan.client.admin import ControllerClient
from capstan.operator import conditions
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.cluster_security import ClusterSecurity, NamespaceAccess
from capstan.operator.controller_admin import ControllerAdmin
from capstan.operator.kube_objects import KubeObjects
from capstan.operator.manifests import names
from capstan.operator.manifests.cluster import ClusterFacts, owner_reference
from capstan.operator.metrics import OperatorMetrics

RETIRE_AFTER_S = 60.0
"""A replaced client is closed this long after (longer than any call's deadline)."""
API_GROUP = "capstan.io"
API_VERSION = "v1alpha1"
RETRY_S = 5.0
"""Back-off of a handler that failed (an unreachable broker, a conflict); Kopf's default
is 60 s."""


@dataclass
class OperatorContext:
    kube: KubeObjects
    facts: ClusterFacts
    metrics: OperatorMetrics
    image: str = "capstan:0.1.0"
    """The image of the controller pods the operator runs."""
    controller_replicas: int = 1
    spark_image: str = "capstan-spark:0.1.0"
    """The image of the scheduled compaction and audit jobs."""
    operator_namespace: str = ""
    """The namespace of the operator's own pod (NetworkPolicies admit it); "" unknown."""
    security: ClusterSecurity | None = None
    """The namespaces' CAs, certificates and cluster secrets, when the operator runs its
    clusters secured (TLS and authentication on, the default); None: in the open."""
    controller_template: Mapping[str, Any] | None = None
    """The controller pods' template (pod_template.py)."""
    _controllers: dict[str, tuple[str, ControllerClient]] = field(default_factory=dict)
    _admins: dict[tuple[str, str], BrokerGroupAdmin] = field(default_factory=dict)
    _controller_admins: dict[str, ControllerAdmin] = field(default_factory=dict)
    _retiring: set[asyncio.Task[None]] = field(default_factory=set)
    _reconciling: weakref.WeakValueDictionary[tuple[str, str, str], asyncio.Lock] = field(
        default_factory=weakref.WeakValueDictionary
    )

    @contextlib.asynccontextmanager
    async def one_at_a_time(self, kind: str, body: Mapping[str, Any]) -> AsyncIterator[None]:
        """One reconcile of an object at a time. Kopf runs an object's change handlers and
        its timer as separate tasks that overlap (a create still syncing when the first
        tick comes): both would read the world as it was and act on it twice (an Event
        told twice, an object made twice)."""
        meta = body.get("metadata") or {}
        key = (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        lock = self._reconciling.get(key)
        if lock is None:
            lock = self._reconciling[key] = asyncio.Lock()
        async with lock:
            yield

    @property
    def secure(self) -> bool:
        return self.security is not None

    async def access(self, namespace: str) -> NamespaceAccess | None:
        """How the operator's clients reach `namespace`'s cluster; None in the open."""
        return None if self.security is None else await self.security.access(namespace)

    async def controller(self, namespace: str) -> ControllerClient:
        """The namespace's controllers, any of which may lead; each call goes to the leader."""
        access = await self.access(namespace)
        digest = access.bundle_digest if access is not None else ""
        known = self._controllers.get(namespace)
        if known is not None and known[0] == digest:
            return known[1]
        addresses = names.controller_addresses(namespace, max(1, self.controller_replicas))
        made = ControllerClient(addresses, retry_s=0, **_tls_and_identity(access))
        self._controllers[namespace] = (digest, made)
        if known is not None:
            self._retire(known[1].close)
        return made

    async def admin(self, namespace: str, group: str, master_pod: str = "") -> BrokerGroupAdmin:
        """capstan.v1 Admin of a broker group, through its master's stable name (a slave
        would pass writes on to it anyway); pod 0 while no master is known."""
        access = await self.access(namespace)
        host = (
            f"{master_pod}.{names.headless_service(group)}.{namespace}.svc"
            if master_pod
            else names.pod_host(group, 0, namespace)
        )
        target = f"{host}:{names.BROKER_GRPC_PORT}"
        digest = access.bundle_digest if access is not None else ""
        key = (namespace, group)
        current = self._admins.get(key)
        if current is None or current.target != target or current.trust != digest:
            if current is not None:
                self._retire(current.close)
            current = BrokerGroupAdmin(target, digest, **_tls_and_identity(access))
            self._admins[key] = current
        return current

    async def controller_admin(self, namespace: str) -> ControllerAdmin:
        """capstan.v1 Admin of the namespace's controllers (static topics are theirs)."""
        access = await self.access(namespace)
        digest = access.bundle_digest if access is not None else ""
        targets = names.controller_addresses(namespace, max(1, self.controller_replicas))
        current = self._controller_admins.get(namespace)
        if current is None or current.targets != targets or current.trust != digest:
            if current is not None:
                self._retire(current.close)
            current = ControllerAdmin(targets, digest, **_tls_and_identity(access))
            self._controller_admins[namespace] = current
        return current

    def _retire(self, close: Callable[[], Awaitable[None]]) -> None:
        """Close a replaced client once no call can still be running on it: other handlers
        may be awaiting a call on it now, and closing its channel would cancel theirs (a
        cancelled Kopf timer stops for good)."""

        async def later() -> None:
            await asyncio.sleep(RETIRE_AFTER_S)
            await close()
            self._retiring.discard(task)

        task = asyncio.get_running_loop().create_task(later())
        self._retiring.add(task)

    async def missing_broker_groups(
        self, namespace: str, wanted: Sequence[str], all_when_terminating: bool = False
    ) -> list[tuple[int, str]]:
        """(index, name) of each of `wanted` that is no BrokerGroup of the namespace; with
        `all_when_terminating`, all of them in a namespace being deleted: its groups' pods
        and claims go with it, and what a finalizer would remove from them with them (a
        BrokerGroup deleted on its own may leave its claims to a successor, so it counts)."""
        if all_when_terminating and await self.kube.namespace_terminating(namespace):
            return list(enumerate(wanted))
        present = {
            g["metadata"]["name"] for g in await self.kube.list_custom("brokergroups", namespace)
        }
        return [(i, g) for i, g in enumerate(wanted) if g not in present]

    async def job_account_owners(self, namespace: str) -> list[dict[str, Any]]:
        """ownerReferences to every BrokerGroup and Topic of `namespace` not being deleted:
        the Spark jobs' account lives while any of them may schedule a job."""
        bodies = [
            *await self.kube.list_custom("brokergroups", namespace),
            *await self.kube.list_custom("topics", namespace),
        ]
        return [
            owner_reference(b, controller=False)
            for b in bodies
            if not b["metadata"].get("deletionTimestamp")
        ]

    async def master_of(self, namespace: str, group: str) -> str:
        """The master pod a BrokerGroup's status names; "" while it has none."""
        found = await self.kube.get_custom("brokergroups", namespace, group)
        return str(((found or {}).get("status") or {}).get("master") or "")

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        for _, c in self._controllers.values():
            await c.close()
        for a in self._admins.values():
            await a.close()
        for front in self._controller_admins.values():
            await front.close()


def _tls_and_identity(access: NamespaceAccess | None) -> dict[str, Any]:
    if access is None:
        return {}
    return {"ca_file": access.ca_file, "credentials": access.identity}


def status_conditions(
    status: Mapping[str, Any], changes: Sequence[conditions.Condition], generation: int
) -> list[dict[str, Any]]:
    return conditions.merged(status.get("conditions") or [], changes, generation)


def missing_groups_conditions(
    status: Mapping[str, Any], missing: Sequence[tuple[int, str]], generation: int
) -> list[dict[str, Any]]:
    """Degraded, naming each field of spec.brokerGroups that names no BrokerGroup."""
    named = ", ".join(f"spec.brokerGroups[{i}]: no BrokerGroup {g!r}" for i, g in missing)
    return status_conditions(
        status,
        conditions.degraded("BrokerGroupNotFound", f"{named} in this namespace"),
        generation,
    )
