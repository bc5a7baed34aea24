"""The node's load-balancer stand-in hands out addresses the way a user of MetalLB expects:
what a Service asks for when it can, the lowest free otherwise, never one address twice,
and the same address across a restart of the stand-in."""

from __future__ import annotations

from types import SimpleNamespace

from tests.kube.load_balancer import (
    ADDRESS_ANNOTATION,
    Balancer,
    assign,
    balancer_of,
    bridge_changes,
)


def test_a_service_gets_what_it_asks_for_and_others_the_lowest_free():
    taken = assign(
        [
            Balancer("a/first", "", ""),
            Balancer("b/asks", "198.19.6.1", ""),
            Balancer("c/second", "", ""),
        ]
    )
    assert taken == {"b/asks": "198.19.6.1", "a/first": "198.19.6.2", "c/second": "198.19.6.3"}


def test_an_address_is_never_given_twice_and_a_shown_one_is_kept():
    taken = assign(
        [
            Balancer("a/holds", "", "198.19.6.7"),
            Balancer("b/wants-the-same", "198.19.6.7", ""),
            Balancer("c/outside-the-pool", "10.0.0.1", ""),
        ]
    )
    # The one holding it keeps it; the one asking for it waits; an address outside the
    # pool is no address this stand-in can give, so that Service takes the lowest free.
    assert taken == {"a/holds": "198.19.6.7", "c/outside-the-pool": "198.19.6.1"}


def test_the_pool_spent_leaves_the_rest_without_an_address():
    many = [Balancer(f"ns/s{i:03d}", "", "") for i in range(260)]
    taken = assign(many)
    assert len(taken) == 254 and len(set(taken.values())) == 254


def test_the_bridge_gains_new_addresses_and_loses_given_back_ones():
    add, remove = bridge_changes(
        {"198.19.6.1", "198.19.6.9"}, {"x/y": "198.19.6.1", "x/z": "198.19.6.2"}
    )
    assert (add, remove) == ({"198.19.6.2"}, {"198.19.6.9"})


def _service(kind: str, annotations: dict[str, str], ingress_ip: str = "") -> SimpleNamespace:
    ingress = [SimpleNamespace(ip=ingress_ip)] if ingress_ip else None
    return SimpleNamespace(
        spec=SimpleNamespace(type=kind),
        metadata=SimpleNamespace(namespace="ns", name="svc", annotations=annotations),
        status=SimpleNamespace(load_balancer=SimpleNamespace(ingress=ingress)),
    )


def test_only_load_balancer_services_are_served():
    assert balancer_of(_service("NodePort", {})) is None
    found = balancer_of(
        _service("LoadBalancer", {ADDRESS_ANNOTATION: " 198.19.6.4 "}, "198.19.6.4")
    )
    assert found == Balancer("ns/svc", "198.19.6.4", "198.19.6.4")
    # An address a cloud gave (outside the pool) is not this stand-in's to keep.
    assert balancer_of(_service("LoadBalancer", {}, "203.0.113.9")) == Balancer("ns/svc", "", "")
