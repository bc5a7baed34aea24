"""A Spark job's last result, written into the status of the Capstan resource it ran for
(`--status-of topics/NAMESPACE/NAME` or `brokergroups/NAMESPACE/NAME`): a compaction into
the Topic's status.compaction, an audit into the BrokerGroup's status.audit. The job patches
the status subresource itself with the Kubernetes API (in a pod: its service account; else
$KUBECONFIG), so the result lands even if the operator is down. Imports no PySpark."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

API_GROUP = "capstan.io"
API_VERSION = "v1alpha1"
_FIELDS = {"topics": "compaction", "brokergroups": "audit"}


@dataclass(frozen=True)
class StatusTarget:
    plural: str
    namespace: str
    name: str

    @property
    def field(self) -> str:
        return _FIELDS[self.plural]

    @classmethod
    def parse(cls, text: str) -> StatusTarget:
        parts = text.split("/")
        if len(parts) != 3 or parts[0] not in _FIELDS or not all(parts):
            raise ValueError(
                f"--status-of {text!r}: give topics/NAMESPACE/NAME or brokergroups/NAMESPACE/NAME"
            )
        return cls(*parts)


def write_status(target: StatusTarget, result: dict[str, Any]) -> None:
    """Merge `result` into the resource's status under its field (compaction or audit)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    client.CustomObjectsApi().patch_namespaced_custom_object_status(
        API_GROUP,
        API_VERSION,
        target.namespace,
        target.plural,
        target.name,
        {"status": {target.field: result}},
    )
