"""spec.listeners: each listener is a Service in front of every broker pod (ClusterIP,
NodePort or LoadBalancer), labelled with its name so a removed one can be found and deleted;
external listeners open the gRPC port of the NetworkPolicy to their `allowFrom` CIDRs
(anywhere by default); a malformed listener is refused by name."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from capstan.operator import resource_rules
from capstan.operator.manifests import names
from tests.operator.test_crds import schema_errors
from tests.operator.test_manifests import body, built

LISTENERS = [
    {"name": "outside", "type": "nodeport", "nodePort": 30881},
    {
        "name": "cloud",
        "type": "loadbalancer",
        "allowFrom": ["203.0.113.0/24"],
        "annotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"},
    },
    {"name": "mesh", "type": "internal"},
]


def services(listeners: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    m = built({"replicas": 3, "listeners": listeners})
    return {s["metadata"]["name"]: s for s in m.listener_services()}


def test_each_listener_is_a_service_in_front_of_every_broker_pod() -> None:
    group = body()["metadata"]["name"]
    made = services(LISTENERS)
    assert sorted(made) == sorted(f"{group}-{n}" for n in ("outside", "cloud", "mesh"))
    selector = names.selector_labels(group, "broker")
    for listener in LISTENERS:
        service = made[f"{group}-{listener['name']}"]
        assert service["spec"]["selector"] == selector
        assert service["metadata"]["labels"][names.LISTENER_LABEL] == listener["name"]
        (port,) = service["spec"]["ports"]
        assert (port["port"], port["targetPort"]) == (names.BROKER_GRPC_PORT, "grpc")
        kubernetes_validate.validate(yaml.safe_load(yaml.safe_dump(service)), "1.30.0", strict=True)
    outside = made[f"{group}-outside"]["spec"]
    assert outside["type"] == "NodePort" and outside["ports"][0]["nodePort"] == 30881
    cloud = made[f"{group}-cloud"]
    assert cloud["spec"]["type"] == "LoadBalancer"
    assert cloud["spec"]["loadBalancerSourceRanges"] == ["203.0.113.0/24"]
    assert cloud["metadata"]["annotations"] == LISTENERS[1]["annotations"]
    assert made[f"{group}-mesh"]["spec"]["type"] == "ClusterIP"
    # Among the group's children, applied with the rest.
    kinds = [(c["kind"], c["metadata"]["name"]) for c in built({"listeners": LISTENERS}).children()]
    assert ("Service", f"{group}-outside") in kinds
    assert built({"replicas": 3}).listener_services() == []


def grpc_peers(listeners: list[dict[str, Any]]) -> list[dict[str, Any]]:
    policy = built({"replicas": 3, "listeners": listeners}).network_policy()
    assert policy is not None
    rule = next(
        r for r in policy["spec"]["ingress"] if r["ports"][0]["port"] == names.BROKER_GRPC_PORT
    )
    peers: list[dict[str, Any]] = rule["from"]
    return peers


def test_external_listeners_open_the_grpc_port_to_their_sources_internal_ones_do_not() -> None:
    plain = grpc_peers([])
    assert not [p for p in plain if "ipBlock" in p]
    assert grpc_peers([{"name": "mesh", "type": "internal"}]) == plain
    anywhere = grpc_peers([{"name": "outside", "type": "nodeport"}])
    assert [p["ipBlock"]["cidr"] for p in anywhere if "ipBlock" in p] == ["0.0.0.0/0", "::/0"]
    narrowed = grpc_peers(LISTENERS[1:])
    assert [p["ipBlock"]["cidr"] for p in narrowed if "ipBlock" in p] == ["203.0.113.0/24"]


@pytest.mark.parametrize(
    "listeners, field, said",
    [
        (
            [{"name": "a", "type": "internal", "nodePort": 30001}],
            "spec.listeners[0].nodePort",
            "nodePort is for listeners of type nodeport",
        ),
        (
            [{"name": "a", "type": "internal"}, {"name": "a", "type": "nodeport"}],
            "spec.listeners[1].name",
            "listener 'a' is named twice",
        ),
        (
            [{"name": "a", "type": "nodeport", "allowFrom": ["10.0.0.300/8"]}],
            "spec.listeners[0].allowFrom[0]",
            "'10.0.0.300/8' is not a CIDR",
        ),
    ],
)
def test_a_malformed_listener_is_refused_by_name(
    listeners: list[dict[str, Any]], field: str, said: str
) -> None:
    errors = resource_rules.broker_group_errors({"replicas": 3, "listeners": listeners})
    assert [e.field for e in errors] == [field]
    assert errors[0].message.startswith(said)


def test_the_schema_takes_listeners_and_refuses_a_wrong_type_or_port() -> None:
    assert schema_errors("BrokerGroup", body({"replicas": 3, "listeners": LISTENERS})) == []
    wrong = [{"name": "a", "type": "ingress"}, {"name": "b", "type": "nodeport", "nodePort": 80}]
    found = schema_errors("BrokerGroup", body({"replicas": 3, "listeners": wrong}))
    assert sorted(e.split(":")[0] for e in found) == [
        "spec.listeners.0.type",
        "spec.listeners.1.nodePort",
    ]


def service(name: str, node_port: int | None = None, ingress: list[Any] | None = None) -> Any:
    from kubernetes import client

    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=8081, node_port=node_port)]),
        status=client.V1ServiceStatus(load_balancer=client.V1LoadBalancerStatus(ingress=ingress)),
    )


def test_the_status_says_where_each_listener_is_reached() -> None:
    from kubernetes import client

    from capstan.operator.listener_status import listener_status

    shown = listener_status(
        "g",
        "shop",
        LISTENERS,
        [
            service("g-outside", node_port=30881),
            service("g-mesh"),
            service("g-unrelated"),
        ],
    )
    assert shown == [
        {
            "name": "outside",
            "type": "nodeport",
            "service": "g-outside",
            "addresses": [],
            "nodePort": 30881,
            "ready": True,
        },
        # The load balancer's Service is not there yet.
        {
            "name": "cloud",
            "type": "loadbalancer",
            "service": "g-cloud",
            "addresses": [],
            "ready": False,
        },
        {
            "name": "mesh",
            "type": "internal",
            "service": "g-mesh",
            "addresses": ["g-mesh.shop.svc:8081"],
            "ready": True,
        },
    ]
    pending = service("g-cloud", ingress=None)
    given = service(
        "g-cloud",
        ingress=[
            client.V1LoadBalancerIngress(ip="203.0.113.7"),
            client.V1LoadBalancerIngress(hostname="mq.example.com"),
        ],
    )
    (waiting,) = listener_status("g", "shop", LISTENERS[1:2], [pending])
    assert waiting["ready"] is False and waiting["addresses"] == []
    (reached,) = listener_status("g", "shop", LISTENERS[1:2], [given])
    assert reached["addresses"] == ["203.0.113.7:8081", "mq.example.com:8081"]
    assert reached["ready"] is True
