"""The test node's cluster DNS: keeps a hosts file for dnsmasq from the API server's Services
and Endpoints, standing in for CoreDNS (which no Debian package provides).

`python -P tests/kube/cluster_dns.py KUBECONFIG HOSTS PIDFILE` polls every half second and, when
the names change, writes HOSTS (beside it, then renamed in) and sends dnsmasq (PIDFILE) a
SIGHUP, which makes it read the file again. The names are CoreDNS's for a cluster domain of
cluster.local:

* a Service with a cluster IP: `<ip> <service>.<namespace>.svc.cluster.local`;
* a headless Service: one such line per ready endpoint address, as the Endpoints controller
  lists them (a Service with `publishNotReadyAddresses` has its pods listed before they are
  ready), plus `<ip> <hostname>.<service>.<namespace>.svc.cluster.local` for an address with
  a hostname (a StatefulSet's pods under their governing Service).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

DOMAIN = "cluster.local"
_POLL_S = 0.5


def hosts_lines(services: list[Any], endpoints: list[Any]) -> list[str]:
    """The hosts file's lines for these Services and Endpoints (kubernetes client objects)."""
    lines: set[str] = set()
    by_name = {(e.metadata.namespace, e.metadata.name): e for e in endpoints}
    for svc in services:
        ns, name = svc.metadata.namespace, svc.metadata.name
        fqdn = f"{name}.{ns}.svc.{DOMAIN}"
        ip = svc.spec.cluster_ip
        if ip and ip != "None":
            lines.add(f"{ip} {fqdn}")
            continue
        ep = by_name.get((ns, name))
        for subset in (ep.subsets or []) if ep is not None else []:
            for address in subset.addresses or []:
                lines.add(f"{address.ip} {fqdn}")
                if address.hostname:
                    lines.add(f"{address.ip} {address.hostname}.{fqdn}")
    return sorted(lines)


def _write(path: Path, text: str) -> None:
    staged = path.with_name(path.name + ".new")
    staged.write_text(text)
    os.replace(staged, path)


def _signal_dnsmasq(pidfile: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pidfile.read_text().split()[0]), signal.SIGHUP)


def main(argv: list[str]) -> int:
    kubeconfig, hosts, pidfile = argv
    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    written: str | None = None
    failing = False
    while True:
        try:
            services = api.list_service_for_all_namespaces(_request_timeout=5).items
            endpoints = api.list_endpoints_for_all_namespaces(_request_timeout=5).items
        except Exception as e:  # noqa: BLE001 - the API server restarts or is not up yet
            if not failing:
                print(f"cluster-dns: cannot list Services and Endpoints: {e}", flush=True)
            failing = True
            time.sleep(_POLL_S)
            continue
        if failing:
            print("cluster-dns: listing again", flush=True)
            failing = False
        text = "".join(line + "\n" for line in hosts_lines(services, endpoints))
        if text != written:
            _write(Path(hosts), text)
            _signal_dnsmasq(Path(pidfile))
            written = text
        time.sleep(_POLL_S)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
