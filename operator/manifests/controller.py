"""The controller of a namespace's broker groups: one small StatefulSet the operator runs.

Its state lives in Kubernetes (a ConfigMap and a Lease: controller/kubernetes_state_store.py),
so a restarted controller pod loses nothing, and a second replica waits on the Lease. Every
BrokerGroup of the namespace is an owner (none of them the managing one), so the garbage
collector removes the controller with the last BrokerGroup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capstan.operator.manifests import names
from capstan.operator.manifests.cluster import ClusterFacts
from capstan.operator.manifests.pod_parts import (
    BROKER_COMPONENT,
    SPARK_JOB_COMPONENT,
    component_peer,
    downward_env,
    operator_peer,
    port_rule,
    restricted_container,
    scratch_mount,
    scratch_volume,
    security_mounts,
    security_settings,
    security_volumes,
)
from capstan.operator.manifests.pod_template import lay_over

COMPONENT = "controller"


@dataclass(frozen=True)
class ControllerManifests:
    namespace: str
    owners: Sequence[Mapping[str, Any]]
    """ownerReferences: every BrokerGroup of the namespace."""
    facts: ClusterFacts
    image: str = "capstan:0.1.0"
    replicas: int = 1
    secure: bool = False
    """TLS on its port and only the cluster's own processes admitted to its changes."""
    operator_namespace: str = ""
    """Where the operator's pod runs (its NetworkPolicy peer); "" when unknown."""
    template: Mapping[str, Any] | None = None
    """The user's pod and container settings (the operator's --controller-template,
    pod_template.py)."""

    def _metadata(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": names.labels(names.CONTROLLER, COMPONENT),
            "ownerReferences": [dict(o) for o in self.owners],
        }

    def service_account(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": self._metadata(names.CONTROLLER),
        }

    def role(self) -> dict[str, Any]:
        """Only its state document and its Lease, in its own namespace."""
        verbs = ["get", "list", "watch", "create", "update", "patch"]
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": self._metadata(names.CONTROLLER),
            "rules": [
                {"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs},
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": verbs},
            ],
        }

    def role_binding(self) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": self._metadata(names.CONTROLLER),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": names.CONTROLLER,
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": names.CONTROLLER, "namespace": self.namespace}
            ],
        }

    def service(self) -> dict[str, Any]:
        """Headless: every replica by its stable name (brokers list them all); not-ready
        replicas included, since only the leader reports ready."""
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": self._metadata(names.CONTROLLER),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": names.selector_labels(names.CONTROLLER, COMPONENT),
                "ports": [
                    {
                        "name": "grpc",
                        "port": names.CONTROLLER_GRPC_PORT,
                        "targetPort": "grpc",
                        "protocol": "TCP",
                    },
                    {
                        "name": "metrics",
                        "port": names.CONTROLLER_METRICS_PORT,
                        "targetPort": "metrics",
                        "protocol": "TCP",
                    },
                ],
            },
        }

    def stateful_set(self) -> dict[str, Any]:
        selector = names.selector_labels(names.CONTROLLER, COMPONENT)
        settings = {
            "listen_host": "$(POD_IP)",
            "controller_id": "$(POD_NAME)",
            "grpc_port": names.CONTROLLER_GRPC_PORT,
            "http_port": names.CONTROLLER_METRICS_PORT,
            "state.backend": "kubernetes",
            "state.namespace": "$(POD_NAMESPACE)",
            "state.name": names.CONTROLLER_STATE,
        }
        if self.secure:
            for section, values in security_settings(with_admin=False).items():
                settings.update({f"{section}.{k}": v for k, v in values.items()})
        args = ["controller"]
        for key, value in settings.items():
            args += ["--set", f"{key}={_setting(value)}"]
        liveness: dict[str, Any] = (
            {"grpc": {"port": names.CONTROLLER_GRPC_PORT}}
            if self.facts.grpc_probes and not self.secure
            else {"httpGet": {"path": "/healthz", "port": "metrics"}}
        )
        container = {
            "name": "controller",
            "image": self.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["capstan"],
            "args": args,
            "env": downward_env(),
            "ports": [
                {"name": "grpc", "containerPort": names.CONTROLLER_GRPC_PORT, "protocol": "TCP"},
                {
                    "name": "metrics",
                    "containerPort": names.CONTROLLER_METRICS_PORT,
                    "protocol": "TCP",
                },
            ],
            # 3 s to answer, as the brokers' probes: the kubelet's 1-s default fails a
            # probe of a loaded pod's Python HTTP server, and six in a row restart it.
            "livenessProbe": {
                **liveness,
                "periodSeconds": 10,
                "failureThreshold": 6,
                "timeoutSeconds": 3,
            },
            # Ready means leading (/readyz): `kubectl get pods` shows the leader, and the
            # headless Service still names every replica (publishNotReadyAddresses).
            "readinessProbe": {
                "httpGet": {"path": "/readyz", "port": "metrics"},
                "periodSeconds": 2,
                "failureThreshold": 1,
                "successThreshold": 1,
                "timeoutSeconds": 3,
            },
            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
            "securityContext": restricted_container(),
            "volumeMounts": [
                scratch_mount(),
                *(security_mounts(with_admin=False) if self.secure else ()),
            ],
        }
        volumes = [scratch_volume()]
        if self.secure:
            volumes += security_volumes(names.CONTROLLER_TLS_SECRET, names.CLUSTER_SECRET)
        pod_template = {
            "metadata": {"labels": names.labels(names.CONTROLLER, COMPONENT)},
            "spec": {
                "serviceAccountName": names.CONTROLLER,
                "terminationGracePeriodSeconds": 30,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 10001,
                    "fsGroup": 10001,  # the secret volumes' group
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [container],
                "volumes": volumes,
            },
        }
        lay_over(self.template, pod_template, container)
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": self._metadata(names.CONTROLLER),
            "spec": {
                "replicas": self.replicas,
                "serviceName": names.CONTROLLER,
                "podManagementPolicy": "Parallel",
                # Ready means leading, so the StatefulSet's rolling update would wait on a
                # follower forever: the operator restarts them (operator/controller_roller.py).
                "updateStrategy": {"type": "OnDelete"},
                "selector": {"matchLabels": selector},
                "template": pod_template,
            },
        }

    def network_policy(self) -> dict[str, Any]:
        """Ingress to the controller: its gRPC port from the namespace's brokers, the
        operator and the scheduled Spark jobs alone; its metrics port from anyone."""
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": self._metadata(names.CONTROLLER),
            "spec": {
                "podSelector": {"matchLabels": names.selector_labels(names.CONTROLLER, COMPONENT)},
                "policyTypes": ["Ingress"],
                "ingress": [
                    port_rule(
                        names.CONTROLLER_GRPC_PORT,
                        [
                            component_peer(BROKER_COMPONENT),
                            operator_peer(self.operator_namespace),
                            component_peer(SPARK_JOB_COMPONENT),
                        ],
                    ),
                    port_rule(names.CONTROLLER_METRICS_PORT, None),
                ],
            },
        }

    def children(self) -> list[dict[str, Any]]:
        return [
            self.service_account(),
            self.role(),
            self.role_binding(),
            self.service(),
            self.stateful_set(),
            self.network_policy(),
        ]


def _setting(value: Any) -> str:
    """A value as `--set` reads it (YAML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
