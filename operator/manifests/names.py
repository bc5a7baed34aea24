"""The names and labels of what the operator creates, in one place.

A BrokerGroup `g` in namespace `ns` becomes the StatefulSet `g`, the headless Service
`g-brokers` (its pods' stable DNS names, `g-N.g-brokers.ns.svc`, under which brokers
register and are routed), the client Service `g`, the ConfigMap `g-config` and the
PodDisruptionBudget `g`. One controller serves every BrokerGroup of a namespace: the
StatefulSet and headless Service `capstan-controller`.
"""

from __future__ import annotations

BROKER_GRPC_PORT = 8081
BROKER_METRICS_PORT = 9100
CONTROLLER_GRPC_PORT = 9876
CONTROLLER_METRICS_PORT = 9101

CONTROLLER = "capstan-controller"
CONTROLLER_STATE = "capstan-controller-state"
"""The controller's state ConfigMap (its Lease is `<this>-leader`)."""

DATA_DIR = "/var/lib/capstan"
CONFIG_DIR = "/etc/capstan"
CONFIG_HASH_ANNOTATION = "capstan.io/config-hash"
MANAGED_BY = "capstan-operator"


def headless_service(group: str) -> str:
    return f"{group}-brokers"


def config_map(group: str) -> str:
    return f"{group}-config"


def pod_host(group: str, ordinal: int, namespace: str) -> str:
    return f"{group}-{ordinal}.{headless_service(group)}.{namespace}.svc"


def controller_addresses(namespace: str, replicas: int) -> list[str]:
    return [
        f"{CONTROLLER}-{i}.{CONTROLLER}.{namespace}.svc:{CONTROLLER_GRPC_PORT}"
        for i in range(replicas)
    ]


def selector_labels(instance: str, component: str) -> dict[str, str]:
    """The labels a Service, PDB and StatefulSet select their pods by (never changed)."""
    return {
        "app.kubernetes.io/name": "capstan",
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
    }


def labels(instance: str, component: str) -> dict[str, str]:
    return {
        **selector_labels(instance, component),
        "app.kubernetes.io/part-of": "capstan",
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
