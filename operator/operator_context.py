"""What every handler of the operator shares: the Kubernetes client, the cluster's facts,
the metrics, and one client per namespace's controller and per broker group."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from capstan.client.admin import ControllerClient
from capstan.operator import conditions
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.kube_objects import KubeObjects
from capstan.operator.manifests import names
from capstan.operator.manifests.cluster import ClusterFacts, owner_reference
from capstan.operator.metrics import OperatorMetrics

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
    _controllers: dict[str, ControllerClient] = field(default_factory=dict)
    _admins: dict[tuple[str, str], BrokerGroupAdmin] = field(default_factory=dict)

    def controller(self, namespace: str) -> ControllerClient:
        """The namespace's controllers, any of which may lead; each call goes to the leader."""
        if namespace not in self._controllers:
            addresses = names.controller_addresses(namespace, max(1, self.controller_replicas))
            self._controllers[namespace] = ControllerClient(addresses, retry_s=0)
        return self._controllers[namespace]

    def admin(self, namespace: str, group: str, master_pod: str = "") -> BrokerGroupAdmin:
        """capstan.v1 Admin of a broker group, through its master's stable name (a slave
        would pass writes on to it anyway); pod 0 while no master is known."""
        host = (
            f"{master_pod}.{names.headless_service(group)}.{namespace}.svc"
            if master_pod
            else names.pod_host(group, 0, namespace)
        )
        target = f"{host}:{names.BROKER_GRPC_PORT}"
        key = (namespace, group)
        current = self._admins.get(key)
        if current is None or current.target != target:
            current = BrokerGroupAdmin(target)
            self._admins[key] = current
        return current

    async def missing_broker_groups(
        self, namespace: str, wanted: Sequence[str]
    ) -> list[tuple[int, str]]:
        """(index, name) of each of `wanted` that is no BrokerGroup of the namespace."""
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
        for c in self._controllers.values():
            await c.close()
        for a in self._admins.values():
            await a.close()


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
