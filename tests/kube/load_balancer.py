"""The test node's load balancers: every Service of type LoadBalancer gets an address from
198.19.6.0/24, standing in for a cloud's balancer or MetalLB (neither can run here).

`python -P tests/kube/load_balancer.py KUBECONFIG BRIDGE` polls every half second. A
LoadBalancer Service without an address takes one: the address its annotation
`lb.capstan-node.test/address` asks for when that is in the pool and free (as MetalLB's
`metallb.universe.tf/loadBalancerIPs` does), else the lowest free one. The address is added
to the node's bridge, so this machine takes traffic for it as its own, and written to the
Service's `status.loadBalancer.ingress`; kube-proxy then carries that traffic to the
Service's pods by its rules for the ingress address (and its source ranges), as it does
traffic a cloud's balancer hands a node. A Service deleted or no longer of the type gives
its address back and it leaves the bridge. Stopping the node deletes the bridge, and every
address on it goes with it.

What a real balancer adds (health checks, a second hop, spreading over nodes) is not stood
in for: with one node there is nothing to spread over.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config

POOL = ipaddress.ip_network("198.19.6.0/24")
ADDRESS_ANNOTATION = "lb.capstan-node.test/address"
_POLL_S = 0.5


@dataclass(frozen=True)
class Balancer:
    key: str
    """namespace/name of the Service."""
    asked: str
    """The address its annotation asks for, "" for any."""
    shown: str
    """The pool address its status shows already, "" for none."""


def assign(balancers: Iterable[Balancer]) -> dict[str, str]:
    """Each Service's address: the one its status shows (kept across a restart of this
    stand-in), else the one it asks for when in the pool and free, else the lowest free;
    a Service the pool cannot serve is left out."""
    wanted = sorted(balancers, key=lambda b: b.key)
    taken: dict[str, str] = {}
    used: set[str] = set()
    for b in wanted:
        if b.shown and b.shown not in used:
            taken[b.key] = b.shown
            used.add(b.shown)
    for b in wanted:
        if b.key in taken:
            continue
        if b.asked and _in_pool(b.asked) and b.asked not in used:
            taken[b.key] = b.asked
            used.add(b.asked)
    free = (str(a) for a in POOL.hosts() if str(a) not in used)
    for b in wanted:
        if b.key in taken or (b.asked and _in_pool(b.asked)):
            continue  # one that asked for a taken address waits for it
        address = next(free, None)
        if address is None:
            break
        taken[b.key] = address
        used.add(address)
    return taken


def _in_pool(address: str) -> bool:
    try:
        return ipaddress.ip_address(address) in POOL
    except ValueError:
        return False


def balancer_of(service: Any) -> Balancer | None:
    """The Balancer of a kubernetes client V1Service, None when it is no LoadBalancer."""
    if service.spec.type != "LoadBalancer":
        return None
    meta = service.metadata
    ingress = (service.status.load_balancer.ingress or []) if service.status.load_balancer else []
    shown = next((i.ip for i in ingress if i.ip and _in_pool(i.ip)), "")
    asked = (meta.annotations or {}).get(ADDRESS_ANNOTATION, "").strip()
    return Balancer(f"{meta.namespace}/{meta.name}", asked, shown)


def bridge_changes(on_bridge: set[str], taken: Mapping[str, str]) -> tuple[set[str], set[str]]:
    """(addresses to add to the bridge, addresses to take off it)."""
    wanted = set(taken.values())
    return wanted - on_bridge, on_bridge - wanted


def _ip(*args: str) -> bool:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    if done.returncode != 0:
        print(f"load-balancer: ip {' '.join(args)}: {done.stderr.strip()}", flush=True)
    return done.returncode == 0


def _addresses_on(bridge: str) -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", bridge],
        capture_output=True,
        text=True,
        check=True,
        timeout=10,
    ).stdout
    found = {line.split()[3].split("/")[0] for line in out.splitlines()}
    return {a for a in found if _in_pool(a)}


def main(argv: list[str]) -> int:
    kubeconfig, bridge = argv
    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    failing = False
    while True:
        time.sleep(_POLL_S)
        try:
            services = api.list_service_for_all_namespaces(_request_timeout=5).items
        except Exception as e:  # noqa: BLE001 - the API server restarts or is not up yet
            if not failing:
                print(f"load-balancer: cannot list Services: {e}", flush=True)
            failing = True
            continue
        failing = False
        by_key: dict[str, tuple[Balancer, Any]] = {}
        for service in services:
            b = balancer_of(service)
            if b is not None:
                by_key[b.key] = (b, service)
        taken = assign(b for b, _ in by_key.values())
        add, remove = bridge_changes(_addresses_on(bridge), taken)
        for address in sorted(add):
            _ip("addr", "add", f"{address}/32", "dev", bridge)
        for address in sorted(remove):
            if _ip("addr", "del", f"{address}/32", "dev", bridge):
                print(f"load-balancer: {address} given back", flush=True)
        for key, address in taken.items():
            b, service = by_key[key]
            if b.shown == address:
                continue
            namespace, name = key.split("/", 1)
            try:
                api.patch_namespaced_service_status(
                    name, namespace, {"status": {"loadBalancer": {"ingress": [{"ip": address}]}}}
                )
            except Exception as e:  # noqa: BLE001 - the Service went meanwhile: next round
                print(f"load-balancer: {key}: {e}", flush=True)
                continue
            print(f"load-balancer: {key} at {address}", flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
