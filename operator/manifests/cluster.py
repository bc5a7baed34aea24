"""What the operator learns about the cluster once, at start, that changes what it builds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterFacts:
    minor: int
    """The API server's minor version (1.<minor>)."""
    policy_v1: bool
    """PodDisruptionBudget is served as policy/v1 (1.21+); else policy/v1beta1."""
    service_monitors: bool
    """The Prometheus Operator's ServiceMonitor CRD is installed."""
    batch_v1_cronjob: bool = True
    """CronJob is served as batch/v1 (1.21+); else batch/v1beta1."""

    @property
    def grpc_probes(self) -> bool:
        """Native gRPC probes are on by default from 1.24 (GA in 1.27)."""
        return self.minor >= 24


def owner_reference(body: dict[str, object], controller: bool = True) -> dict[str, object]:
    """An ownerReference to the custom resource `body`: its children are garbage-collected
    with it. `controller` marks the one owner that manages the child."""
    metadata = body["metadata"]
    assert isinstance(metadata, dict)
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "name": metadata["name"],
        "uid": metadata["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }
