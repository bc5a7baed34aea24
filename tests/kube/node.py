"""A real two-node Kubernetes 1.20.2 on this machine: the test platform's cluster for pods.

`python -P tests/kube/node.py start DIR` (stdlib only, so it runs as a script) starts etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, dockerd, kubelet (dockershim, CNI
bridge), the second node's containerd and kubelet (CRI, its own CNI bridge; tainted, so
only pods that tolerate it run there), kube-proxy (iptables), dnsmasq and the cluster DNS
watcher (cluster_dns.py), the load-balancer stand-in (load_balancer.py), makes local
PersistentVolumes and a default no-provisioner StorageClass, waits for both nodes to be
Ready and prints the kubeconfig's path as its last line. `stop DIR` stops all of it and
undoes what it changed on the machine: sysctls, iptables/nft tables, bridges and veths,
cgroups, mounts and the files the components write outside DIR. A start that fails tears
down what it started before it says why.

Every address is fixed and inside 198.18.0.0/15 (the node 198.19.0.1 on the bridge capnode0,
pods 198.19.2.0/24 on capcni0, Services 198.19.4.0/24, load balancers 198.19.6.0/24 on
capnode0; the second node 198.19.0.2, its pods 198.19.3.0/24 on capcni1), so one such
cluster runs per machine: a record under /run names the DIR that holds it. Nothing leaves
the machine: images are built here and never pulled (`imagePullPolicy: Never` or present),
pods route only 198.18.0.0/15, DNS answers cluster names and never forwards, kubelet's cloud
metadata probe is off.

Images live in dockerd's store, kept across runs in the cache
(`~/.cache/capstan/node/docker`): scripts/k8s_images.sh builds them into it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

VERSION = "1.20.2"
NODE_NAME = "capstan-node"
NODE_IP = "198.19.0.1"
NODE_BRIDGE = "capnode0"
POD_BRIDGE = "capcni0"
POD_CIDR = "198.19.2.0/24"
POD_GATEWAY = "198.19.2.1"
SERVICE_CIDR = "198.19.4.0/24"
DNS_IP = "198.19.4.10"
LB_POOL = "198.19.6.0/24"
"""Where LoadBalancer Services' addresses come from (load_balancer.py)."""
ALLOWED_ROUTE = "198.18.0.0/15"
NO_PULL_PROXY = "http://127.0.0.1:9"
"""dockerd's proxy for registries: a closed port on loopback, so a pull fails at once, here."""
NO_PULL_ENV = {
    "HTTPS_PROXY": NO_PULL_PROXY,
    "HTTP_PROXY": NO_PULL_PROXY,
    "https_proxy": NO_PULL_PROXY,
    "http_proxy": NO_PULL_PROXY,
    "NO_PROXY": "",
    "no_proxy": "",
}
"""The environment of both runtimes (dockerd, the second node's containerd)."""
# The node's fixed ports stay in 23000-29999, above the ports tests pick
# (tests/broker/broker_process.RUN_PORTS).
API_PORT = 26443
ETCD_CLIENT, ETCD_PEER = 23791, 23801
TOKEN = "capstan-node-admin-token"
PAUSE_IMAGE = "local/pause:3.4.1"
VOLUMES = 24
# Folders on the machine's disk: the size is what a claim may ask for (the examples' 20Gi),
# not a quota.
VOLUME_SIZE = "20Gi"
STORAGE_CLASS = "capstan-local"


@dataclass(frozen=True)
class KubeletSpec:
    """One node's kubelet: the Node's name, its address on NODE_BRIDGE, its pods' bridge and
    subnet, its ports, its folder under DIR (also its log's and pid's name) and the cgroup
    its pods go under."""

    name: str
    ip: str
    pod_bridge: str
    pod_cidr: str
    pod_gateway: str
    port: int
    healthz_port: int
    folder: str
    cgroup_root: str = "/"
    taints: tuple[str, ...] = ()


FIRST = KubeletSpec(NODE_NAME, NODE_IP, POD_BRIDGE, POD_CIDR, POD_GATEWAY, 23250, 23248, "kubelet")
SECOND_TAINT = "capstan.test/second-node"
"""Only pods that tolerate it run on the second node: the rest of the suite sees one node."""
SECOND = KubeletSpec(
    "capstan-node-b",
    "198.19.0.2",
    "capcni1",
    "198.19.3.0/24",
    "198.19.3.1",
    23260,
    23258,
    "kubelet-b",
    cgroup_root="/capnode-b",
    taints=(f"{SECOND_TAINT}=true:NoSchedule",),
)
"""The second node: its own kubelet on its own containerd (two kubelets on one dockerd kill
each other's containers), in the same network namespace as the first, so one kube-proxy and
the host's routes between the two pod bridges serve both."""
SECOND_VOLUMES = 6
SECOND_REPOSITORIES = ("local/pause", "local/debian", "local/capstan")
"""What the second node's containerd gets from dockerd's store: every tag of the brokers'
image and of its base (they share their layers), and the pods' sandbox."""
PODS_CIDR = "198.19.2.0/23"
"""Both nodes' pod subnets: kube-proxy's clusterCIDR."""


def local_volume(
    name: str,
    node: str,
    path: Path | str,
    storage_class: str = STORAGE_CLASS,
    size: str = VOLUME_SIZE,
) -> dict[str, object]:
    """A local PersistentVolume: the directory `path` on `node`, kept when released."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "local": {"path": str(path)},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": "kubernetes.io/hostname",
                                    "operator": "In",
                                    "values": [node],
                                }
                            ]
                        }
                    ]
                }
            },
        },
    }


RECORD = Path("/run/capstan-k8s-node")
"""Which DIR holds this machine's node, and the machine's state before it started."""

# Started in this order, stopped in the reverse.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "dockerd",
    "kubelet",
    "containerd-b",
    "kubelet-b",
    "kube-proxy",
    "dnsmasq",
    "cluster-dns",
    "load-balancer",
)

DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
"""Where every 1.20 kubelet listens for device plugins, whatever its --root-dir: each
empties the folder, then binds kubelet.sock there, so two starting at once failed with
"address already in use" (a CI run's second kubelet); the second node's has its own."""

# Files and folders the components make outside DIR whatever their flags say.
OUTSIDE_PATHS = (
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/lib/dockershim",
    "/run/dockershim.sock",
    "/var/run/dockershim.sock",
    "/run/docker",
    "/run/containerd",
    "/run/runc",
    "/run/netns",
    "/opt/containerd",
    "/etc/cni",
)

# Kernel settings that kubelet, kube-proxy and dockerd are known to change, by prefix.
SYSCTL_PREFIXES = (
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/",
    "net/ipv4/conf/default/",
    "net/ipv4/conf/lo/",
    "net/ipv6/conf/all/",
    "net/ipv6/conf/default/",
    "net/bridge/",
    "net/netfilter/",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/",
)

CGROUP_NAMES = ("kubepods", "kubepods.slice", "docker", "k8s.io", SECOND.cgroup_root.strip("/"))

_READY_S = 120.0
_PRESSURE_S = 60.0
"""How long a Ready node may stay under a pressure condition before the start gives up."""


class NodeError(RuntimeError):
    """The node cannot start or stop; the message says why and what to do."""


def binaries() -> Path:
    """Where scripts/k8s_tools.sh caches the Kubernetes binaries."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "capstan" / "kubernetes" / VERSION / "bin"


def kubectl_binary() -> str:
    """kubectl 1.20.2, the cluster's own version, as scripts/k8s_tools.sh builds it; the
    one on PATH only where it has not been built (a cluster of one's own)."""
    built = binaries() / "kubectl"
    return str(built) if built.exists() else "kubectl"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "capstan" / "node"


def docker_root() -> Path:
    return cache_dir() / "docker"


def _free_space(paths: Iterable[Path]) -> str:
    """`<path>: <free> GiB free of <size> GiB (<inodes free> inodes free)` for each path."""
    parts = []
    for path in paths:
        st = os.statvfs(path)
        free_gib = st.f_bavail * st.f_frsize / 2**30
        size_gib = st.f_blocks * st.f_frsize / 2**30
        parts.append(
            f"{path}: {free_gib:.1f} GiB free of {size_gib:.1f} GiB ({st.f_favail} inodes free)"
        )
    return ", ".join(parts)


def docker_socket(root: Path) -> Path:
    return root / "run" / "docker.sock"


# ---- the machine's state, kept to undo ------------------------------------------------------


def _sysctl_files() -> Iterator[Path]:
    base = Path("/proc/sys")
    for prefix in SYSCTL_PREFIXES:
        head = base / prefix
        if prefix.endswith("/"):
            if head.is_dir():
                yield from (p for p in sorted(head.rglob("*")) if p.is_file())
        elif head.is_file():
            yield head
        else:
            yield from sorted(p for p in head.parent.glob(head.name + "*") if p.is_file())


def read_sysctls() -> dict[str, str]:
    values = {}
    for path in _sysctl_files():
        if not os.access(path, os.W_OK):
            continue
        try:
            values[str(path)] = path.read_text()
        except OSError:
            continue  # write-only or refused in this namespace
    return values


def _run(argv: list[str], *, check: bool = True, timeout: float = 60) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise NodeError(f"{' '.join(argv)} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def _nft_tables() -> list[str]:
    if shutil.which("nft") is None:
        return []
    out = _run(["nft", "list", "tables"], check=False)
    return [line.strip() for line in out.splitlines() if line.startswith("table ")]


def _iptables_save(tool: str) -> str:
    return _run([tool], check=False) if shutil.which(tool) else ""


def _links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"], check=False)
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _cgroups() -> list[str]:
    return [
        str(controller / name)
        for controller in Path("/sys/fs/cgroup").iterdir()
        for name in CGROUP_NAMES
        if (controller / name).is_dir()
    ]


def snapshot() -> dict[str, object]:
    return {
        "sysctls": read_sysctls(),
        "nft_tables": _nft_tables(),
        "iptables": _iptables_save("iptables-save"),
        "ip6tables": _iptables_save("ip6tables-save"),
        "links": _links(),
        "cgroups": _cgroups(),
        "paths": [p for p in OUTSIDE_PATHS if os.path.lexists(p)],
    }


# ---- starting ---------------------------------------------------------------------------


class Node:
    """The node held in `root` (DIR)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.kubeconfig = self.root / "kubeconfig"
        self.logs = self.root / "logs"
        self.pids = self.root / "pids"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        """The processes this object started (a start and a stop in one process: tests)."""

    # -- record: one node per machine --

    def _claim(self, progress: Callable[[str], None]) -> None:
        if RECORD.exists():
            held = (RECORD / "root").read_text().strip() if (RECORD / "root").exists() else "?"
            if held == "?" or _running(Path(held)):
                raise NodeError(
                    f"a Capstan test node already holds this machine (its DIR is {held}); "
                    f"stop it first: scripts/k8s_node.sh stop {held}"
                )
            # Its processes are gone (a killed run, a restarted machine) but its changes
            # stayed: undo them from its record before this node makes its own.
            progress(f"== node: the node of {held} died without a stop; undoing its changes")
            left = Node(Path(held)).stop(progress)
            if left:
                raise NodeError(
                    f"the dead node of {held} could not be undone ({'; '.join(left)}); "
                    f"see scripts/k8s_node.sh stop {held}"
                )
        clashing = [n for n in (NODE_BRIDGE, POD_BRIDGE, SECOND.pod_bridge) if n in _links()]
        if clashing:
            raise NodeError(
                f"the link {clashing[0]} exists but no node is recorded: a node of another "
                "run was not torn down; remove it (ip link del) and start again"
            )
        RECORD.mkdir(parents=True)
        (RECORD / "root").write_text(f"{self.root}\n")
        (RECORD / "before.json").write_text(json.dumps(snapshot()))

    # -- processes --

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                cwd=self.root,
            )
        (self.pids / name).write_text(f"{proc.pid}\n")
        self._procs[name] = proc

    def _pid(self, name: str) -> int | None:
        try:
            return int((self.pids / name).read_text())
        except (OSError, ValueError):
            return None

    def _alive(self, name: str) -> bool:
        pid = self._pid(name)
        return pid is not None and Path(f"/proc/{pid}").exists() and not _zombie(pid)

    def _log_tail(self, name: str, lines: int = 6) -> str:
        path = self.logs / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _wait(
        self, what: str, check: Callable[[], bool], names: Iterable[str], timeout_s: float
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name in names:
                if not self._alive(name):
                    raise NodeError(
                        f"{name} exited while waiting for {what}: {self._log_tail(name)}"
                    )
            try:
                if check():
                    return
            except (OSError, subprocess.SubprocessError, NodeError):
                pass
            time.sleep(0.3)
        raise NodeError(f"{what} not within {timeout_s:.0f} s: {self._log_tail(list(names)[-1])}")

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout_s: float = 60
    ) -> str:
        """kubectl on this node; `timeout_s` must outlast a `--timeout` given to kubectl."""
        done = subprocess.run(
            [str(binaries() / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and done.returncode != 0:
            raise NodeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    # -- start --

    def start(self, progress: Callable[[str], None] = print) -> Path:
        missing = [
            b
            for b in (
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubelet",
                "kube-proxy",
                "kubectl",
            )
            if not (binaries() / b).exists()
        ]
        tools = ("etcd", "dockerd", "dnsmasq", "iptables", "nft", "openssl")
        missing += [t for t in tools if shutil.which(t) is None]
        if missing:
            raise NodeError(
                f"missing {', '.join(missing)}: run scripts/k8s_node.sh, which installs them"
            )
        if not Path("/usr/lib/cni/bridge").exists():
            raise NodeError(
                "the CNI plugins are missing: apt-get install containernetworking-plugins"
            )
        self.root.mkdir(parents=True, exist_ok=True)
        self._claim(progress)
        try:
            started = time.monotonic()
            self._network()
            progress("== node: control plane")
            self._control_plane()
            progress("== node: dockerd")
            self._dockerd()
            progress("== node: images")
            self._images(progress)
            if not self._has_image(PAUSE_IMAGE):
                raise NodeError(
                    f"dockerd has no {PAUSE_IMAGE}: build the images first (scripts/k8s_images.sh)"
                )
            progress("== node: the second node's containerd and images")
            self._containerd()
            progress("== node: kubelets, kube-proxy, DNS, load balancers")
            self._kubelet(
                FIRST,
                [
                    "--container-runtime=docker",
                    f"--docker-endpoint=unix://{self.root / 'docker.sock'}",
                ],
            )
            self._cgroup_root(SECOND)
            self._second_kubelet()
            self._kube_proxy()
            self._dns()
            self._load_balancers()
            progress("== node: storage")
            self._storage()
            for spec in (FIRST, SECOND):
                ready = functools.partial(self._node_ready, spec.name)
                self._wait(f"{spec.name} Ready", ready, (spec.folder,), _READY_S)
                self._wait_without_pressure(spec.name)
            progress(f"== node: Ready in {time.monotonic() - started:.1f} s")
        except BaseException:
            progress(f"== node: start failed; tearing down (logs kept in {self.logs})")
            with contextlib.suppress(Exception):
                self.stop(progress)
            raise
        return self.kubeconfig

    def _network(self) -> None:
        _run(["ip", "link", "add", NODE_BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{NODE_IP}/32", "dev", NODE_BRIDGE])
        _run(["ip", "addr", "add", f"{SECOND.ip}/32", "dev", NODE_BRIDGE])
        _run(["ip", "link", "set", NODE_BRIDGE, "up"])
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
        Path("/proc/sys/net/bridge/bridge-nf-call-iptables").write_text("1\n")

    def _control_plane(self) -> None:
        r = self.root
        (r / "certs").mkdir(exist_ok=True)
        _run(["openssl", "genrsa", "-out", str(r / "sa.key"), "2048"])
        _run(["openssl", "rsa", "-in", str(r / "sa.key"), "-pubout", "-out", str(r / "sa.pub")])
        (r / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
        bin_dir = binaries()
        self._spawn(
            "etcd",
            [
                "etcd",
                f"--data-dir={r / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT}",
                f"--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT}",
                f"--listen-peer-urls=http://127.0.0.1:{ETCD_PEER}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER}",
                f"--initial-cluster=default=http://127.0.0.1:{ETCD_PEER}",
                "--listen-metrics-urls=http://127.0.0.1:23811",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT}",
                # On the node's address (not 127.0.0.1), so pods reach it through the
                # `kubernetes` Service.
                f"--bind-address={NODE_IP}",
                f"--advertise-address={NODE_IP}",
                f"--secure-port={API_PORT}",
                "--insecure-port=0",
                f"--cert-dir={r / 'certs'}",
                f"--token-auth-file={r / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # logs and exec reach the kubelet at its address, never through a resolver
                "--kubelet-preferred-address-types=InternalIP",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={r / 'sa.pub'}",
                f"--service-account-signing-key-file={r / 'sa.key'}",
            ],
        )
        self._wait("kube-apiserver", self._api_ready, ("etcd", "kube-apiserver"), 90)
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: capstan-node, cluster: {{server: 'https://{NODE_IP}:{API_PORT}', "
            f"certificate-authority: '{r / 'certs' / 'apiserver.crt'}'}}}}]\n"
            f"users: [{{name: admin, user: {{token: {TOKEN}}}}}]\n"
            "contexts: [{name: capstan-node, context: {cluster: capstan-node, user: admin}}]\n"
            "current-context: capstan-node\n"
        )
        self._spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=26257",
                "--port=0",
                f"--service-account-private-key-file={r / 'sa.key'}",
                f"--root-ca-file={r / 'certs' / 'apiserver.crt'}",
                "--use-service-account-credentials=true",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(bin_dir / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=26259",
                "--port=0",
            ],
        )

    def _api_ready(self) -> bool:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the cert is written once it serves
        request = urllib.request.Request(
            f"https://{NODE_IP}:{API_PORT}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(request, timeout=2, context=context) as reply:
            return reply.status == 200

    def _dockerd(self) -> None:
        r = self.root
        clamp = r / "runc-clamp"
        # kubelet asks for a negative oom_score_adj that this sandbox may not set (runc fails
        # "can't get final child's PID from pipe"): clamp it to 0 in each bundle runc gets.
        clamp.write_text(
            "#!/bin/bash\n"
            'prev=""; bundle=""\n'
            'for a in "$@"; do [ "$prev" = "--bundle" ] && bundle="$a"; prev="$a"; done\n'
            'if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then\n'
            '  adj=$(jq ".process.oomScoreAdj // 0" "$bundle/config.json")\n'
            '  if [ "$adj" -lt 0 ]; then\n'
            '    jq ".process.oomScoreAdj = 0" "$bundle/config.json" > "$bundle/config.json.tmp"\n'
            '    mv "$bundle/config.json.tmp" "$bundle/config.json"\n'
            "  fi\n"
            "fi\n"
            'exec /usr/sbin/runc "$@"\n'
        )
        clamp.chmod(0o755)
        data = docker_root()
        data.mkdir(parents=True, exist_ok=True)
        (r / "docker-exec").mkdir(exist_ok=True)
        sock = r / "docker.sock"
        self._spawn(
            "dockerd",
            [
                "dockerd",
                f"--data-root={data}",
                f"--exec-root={r / 'docker-exec'}",
                f"--host=unix://{sock}",
                f"--pidfile={r / 'docker.pid'}",
                "--bridge=none",
                "--iptables=false",
                "--ip-forward=false",
                "--ip-masq=false",
                f"--add-runtime=clamp={clamp}",
                "--default-runtime=clamp",
                "--log-driver=json-file",
            ],
            # Nothing is ever pulled: every image is built here. A pod naming an image the
            # store lacks makes dockerd try a registry; its requests go to a proxy on a
            # closed local port and fail there, with no lookup or connection off the machine.
            env=NO_PULL_ENV,
        )
        self._wait("dockerd", lambda: self._docker("info").strip() != "", ("dockerd",), 60)
        # The store is kept across nodes for its images; containers of a node that died
        # without a stop are not this node's pods.
        self._remove_containers()

    def _images(self, progress: Callable[[str], None]) -> None:
        script = Path(__file__).resolve().parents[2] / "scripts" / "k8s_images.sh"
        if not script.exists():
            return
        env = {**os.environ, "DOCKER_HOST": f"unix://{self.root / 'docker.sock'}"}
        with (self.logs / "images.log").open("ab") as log:
            done = subprocess.run(
                ["bash", str(script)], env=env, stdout=log, stderr=subprocess.STDOUT
            )
        if done.returncode != 0:
            raise NodeError(f"building the images failed: {self._log_tail('images')}")

    def _docker(self, *args: str, check: bool = True) -> str:
        return _run(["docker", "--host", f"unix://{self.root / 'docker.sock'}", *args], check=check)

    def _has_image(self, image: str) -> bool:
        return bool(self._docker("images", "-q", image, check=False).strip())

    def _kubelet(
        self, spec: KubeletSpec, runtime: list[str], prefix: list[str] | None = None
    ) -> None:
        r = self.root
        k = r / spec.folder
        for sub in ("root", "pki", "cni-cache"):
            (k / sub).mkdir(parents=True, exist_ok=True)
        # Only a nameserver nobody answers at: pods' DNS is the cluster's and ends there.
        (k / "resolv.conf").write_text("nameserver 198.19.0.53\n")
        (k / "config.yaml").write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\n"
            "kind: KubeletConfiguration\n"
            "cgroupDriver: cgroupfs\n"
            f"cgroupRoot: {spec.cgroup_root}\n"
            "failSwapOn: false\n"
            f"address: {spec.ip}\n"
            f"port: {spec.port}\n"
            "readOnlyPort: 0\n"
            "healthzBindAddress: 127.0.0.1\n"
            f"healthzPort: {spec.healthz_port}\n"
            f"resolvConf: {k / 'resolv.conf'}\n"
            f"clusterDNS: [{DNS_IP}]\n"
            "clusterDomain: cluster.local\n"
            "authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}\n"
            "authorization: {mode: AlwaysAllow}\n"
            "evictionHard: {memory.available: 100Mi, nodefs.available: 1%, "
            "imagefs.available: 1%, nodefs.inodesFree: 1%}\n"
            "imageGCHighThresholdPercent: 100\n"
            "imageGCLowThresholdPercent: 99\n"
            "serializeImagePulls: false\n"
            # The API rate of Kubernetes 1.27 and later (1.20's 5 a second, burst 10,
            # spread a power loss's pod status updates over 10 s: Ready reached the API
            # server, and the Services, seconds after the kubelet saw it).
            "kubeAPIQPS: 50\n"
            "kubeAPIBurst: 100\n"
        )
        cni = self._cni_config(spec)
        taints = [f"--register-with-taints={','.join(spec.taints)}"] if spec.taints else []
        self._spawn(
            spec.folder,
            [
                *(prefix or []),
                str(binaries() / "kubelet"),
                f"--config={k / 'config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={k / 'root'}",
                f"--cert-dir={k / 'pki'}",
                f"--hostname-override={spec.name}",
                f"--node-ip={spec.ip}",
                *runtime,
                "--network-plugin=cni",
                "--cni-bin-dir=/usr/lib/cni",
                f"--cni-conf-dir={cni}",
                f"--cni-cache-dir={k / 'cni-cache'}",
                f"--pod-infra-container-image={PAUSE_IMAGE}",
                *taints,
            ],
            # else 1.20's AWS credential provider probes the cloud metadata address
            env={"AWS_EC2_METADATA_DISABLED": "true"},
        )

    def _second_kubelet(self) -> None:
        self._kubelet(
            SECOND,
            [
                "--container-runtime=remote",
                f"--container-runtime-endpoint=unix://{self._containerd_socket()}",
                "--runtime-request-timeout=5m",
            ],
            self._in_namespace_of("containerd-b"),
        )

    # -- losing the second node and bringing it back (the e2e story's node loss) --

    def lose_second(self) -> int:
        """The second node lost as a machine that stops, without a drain: its kubelet
        killed (the API server stops hearing from it, nothing restarts its pods), then
        every container it ran, pods' sandboxes included (SIGKILL through its containerd,
        which stays up, as the node's disk would, so the node can come back). How many
        containers were killed."""
        pid = self._pid(SECOND.folder)
        if pid is None or not self._alive(SECOND.folder):
            raise NodeError(f"{SECOND.name}'s kubelet is not running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self._alive(SECOND.folder) and time.monotonic() < deadline:
            time.sleep(0.05)
        tasks = self._ctr("tasks", "list", "-q", check=False).split()
        for task in tasks:
            self._ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        return len(tasks)

    def bring_back_second(self) -> None:
        """The lost second node back: its kubelet started again, which restarts its pods'
        containers; returns once the node is Ready."""
        if self._alive(SECOND.folder):
            return
        self._second_kubelet()
        # It outlives this object (the node's stop ends it by its pid file): a thread of
        # this process waits on it, so it is reaped whenever it ends.
        kubelet = self._procs.pop(SECOND.folder)
        threading.Thread(target=kubelet.wait, name="kubelet-b-reaper", daemon=True).start()
        ready = functools.partial(self._node_ready, SECOND.name)
        self._wait(f"{SECOND.name} Ready again", ready, (SECOND.folder,), _READY_S)

    def _cni_config(self, spec: KubeletSpec) -> Path:
        """The folder of `spec`'s CNI configuration: a bridge of its own, its own subnet."""
        cni = self.root / "cni" / spec.folder
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-capstan.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "capstan",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": spec.pod_bridge,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "dataDir": str(cni / "ipam"),
                                "ranges": [
                                    [{"subnet": spec.pod_cidr, "gateway": spec.pod_gateway}]
                                ],
                                # Pods reach the test cluster's addresses and nothing else.
                                "routes": [{"dst": ALLOWED_ROUTE}],
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                        {"type": "loopback"},
                    ],
                },
                indent=1,
            )
        )
        return cni / "net.d"

    def _containerd(self) -> None:
        """The second node's runtime: a containerd of its own (root, state and socket in
        DIR) with its CRI plugin, given the brokers' image from dockerd's store."""
        c = self.root / "containerd"
        c.mkdir(exist_ok=True)
        cni = self._cni_config(SECOND)
        (c / "config.toml").write_text(
            "version = 2\n"
            f'root = "{c / "root"}"\n'
            f'state = "{c / "state"}"\n'
            # the opt plugin would make /opt/containerd
            'disabled_plugins = ["io.containerd.internal.v1.opt"]\n'
            "[grpc]\n"
            f'  address = "{c / "containerd.sock"}"\n'
            "[ttrpc]\n"
            f'  address = "{c / "containerd.sock.ttrpc"}"\n'
            "[debug]\n"
            f'  address = "{c / "debug.sock"}"\n'
            "[metrics]\n"
            '  address = ""\n'
            '[plugins."io.containerd.grpc.v1.cri"]\n'
            f'  sandbox_image = "{PAUSE_IMAGE}"\n'
            # this sandbox may not lower oom_score_adj (the first node's runc is clamped)
            "  restrict_oom_score_adj = true\n"
            "  enable_selinux = false\n"
            "  netns_mounts_under_state_dir = true\n"  # in DIR, unmounted with it
            '  stream_server_address = "127.0.0.1"\n'
            '  stream_server_port = "23270"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd]\n'
            '  snapshotter = "overlayfs"\n'
            '  default_runtime_name = "runc"\n'
            '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
            '  runtime_type = "io.containerd.runc.v2"\n'
            '[plugins."io.containerd.grpc.v1.cri".cni]\n'
            '  bin_dir = "/usr/lib/cni"\n'
            f'  conf_dir = "{cni}"\n'
        )
        self._spawn(
            "containerd-b",
            [*self._own_log_folders(SECOND), "containerd", f"--config={c / 'config.toml'}"],
            env=NO_PULL_ENV,
        )
        self._wait(
            "the second node's containerd",
            lambda: self._ctr("version", check=True) != "",
            ("containerd-b",),
            60,
        )
        images = [
            image
            for repository in SECOND_REPOSITORIES
            for image in self._docker(
                "images", "--format", "{{.Repository}}:{{.Tag}}", repository
            ).split()
            if not image.endswith(":<none>")
        ]
        for image in images:
            saved = subprocess.Popen(
                ["docker", "--host", f"unix://{self.root / 'docker.sock'}", "save", image],
                stdout=subprocess.PIPE,
            )
            try:
                loaded = subprocess.run(
                    [*self._ctr_argv(), "images", "import", "-"],
                    stdin=saved.stdout,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
            finally:
                assert saved.stdout is not None
                saved.stdout.close()
                saved.wait(timeout=60)
            if loaded.returncode != 0 or saved.returncode != 0:
                raise NodeError(f"{image} into the second node: {loaded.stderr.strip()}")

    def _containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    def _own_log_folders(self, spec: KubeletSpec) -> list[str]:
        """A command prefix: run in a mount namespace of its own where /var/log/pods and
        /var/log/containers are folders of `spec`'s in DIR. Every kubelet writes pod logs
        there (a fixed path in 1.20) and its garbage collector removes the folders of pods
        it does not run, so two kubelets sharing them delete each other's logs. The
        second node's containerd runs in it, and its kubelet joins it (`_in_namespace_of`).
        The namespace, and the mounts made in it, go when its last process does."""
        logs = self.root / spec.folder / "logs"
        for name in ("pods", "containers"):
            (logs / name).mkdir(parents=True, exist_ok=True)
            Path("/var/log", name).mkdir(parents=True, exist_ok=True)
        plugins = self.root / spec.folder / "device-plugins"
        plugins.mkdir(parents=True, exist_ok=True)
        DEVICE_PLUGINS.mkdir(parents=True, exist_ok=True)
        script = (
            'mount --bind "$1" /var/log/pods && mount --bind "$2" /var/log/containers'
            f' && mount --bind "$3" {DEVICE_PLUGINS} && shift 3 && exec "$@"'
        )
        return [
            *("unshare", "--mount", "--propagation", "slave", "--"),
            *("sh", "-c", script, "sh", str(logs / "pods"), str(logs / "containers")),
            str(plugins),
        ]

    def _in_namespace_of(self, name: str) -> list[str]:
        """A command prefix: join the mount namespace of the component `name`."""
        return ["nsenter", f"--mount=/proc/{self._pid(name)}/ns/mnt", "--"]

    def _ctr_argv(self) -> list[str]:
        return ["ctr", "--address", str(self._containerd_socket()), "--namespace", "k8s.io"]

    def _ctr(self, *args: str, check: bool = True) -> str:
        return _run([*self._ctr_argv(), *args], check=check)

    def _kube_proxy(self) -> None:
        config = self.root / "kube-proxy.yaml"
        config.write_text(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n"
            "kind: KubeProxyConfiguration\n"
            "mode: iptables\n"
            f"clusterCIDR: {PODS_CIDR}\n"
            f"hostnameOverride: {NODE_NAME}\n"
            f"bindAddress: {NODE_IP}\n"
            "healthzBindAddress: 127.0.0.1:23256\n"
            "metricsBindAddress: 127.0.0.1:23249\n"
            f"nodePortAddresses: ['{NODE_IP}/32']\n"
            "conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}\n"
            f"clientConnection: {{kubeconfig: '{self.kubeconfig}'}}\n"
        )
        self._spawn("kube-proxy", [str(binaries() / "kube-proxy"), f"--config={config}"])

    def _dns(self) -> None:
        dns = self.root / "dns"
        dns.mkdir(exist_ok=True)
        (dns / "hosts").write_text("")
        self._spawn(
            "dnsmasq",
            [
                "dnsmasq",
                "--keep-in-foreground",
                "--user=root",
                f"--pid-file={dns / 'pid'}",
                f"--log-facility={dns / 'log'}",
                f"--listen-address={NODE_IP}",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                f"--addn-hosts={dns / 'hosts'}",
                "--local=/cluster.local/",
                "--local-ttl=1",
            ],
        )
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": [
                        {
                            "apiVersion": "v1",
                            "kind": "Service",
                            "metadata": {"name": "kube-dns", "namespace": "kube-system"},
                            "spec": {
                                "clusterIP": DNS_IP,
                                "ports": [
                                    {"name": "dns", "port": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                                ],
                            },
                        },
                        {
                            "apiVersion": "v1",
                            "kind": "Endpoints",
                            "metadata": {"name": "kube-dns", "namespace": "kube-system"},
                            "subsets": [
                                {
                                    "addresses": [{"ip": NODE_IP}],
                                    "ports": [
                                        {"name": "dns", "port": 53, "protocol": "UDP"},
                                        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
                                    ],
                                }
                            ],
                        },
                    ],
                }
            ),
        )
        self._spawn(
            "cluster-dns",
            [
                sys.executable,
                "-P",
                str(Path(__file__).with_name("cluster_dns.py")),
                str(self.kubeconfig),
                str(dns / "hosts"),
                str(dns / "pid"),
            ],
        )

    def _load_balancers(self) -> None:
        """LoadBalancer Services get addresses in LB_POOL on the node's bridge
        (load_balancer.py, standing in for a cloud's balancer)."""
        self._spawn(
            "load-balancer",
            [
                sys.executable,
                "-P",
                str(Path(__file__).with_name("load_balancer.py")),
                str(self.kubeconfig),
                NODE_BRIDGE,
            ],
        )

    def _storage(self) -> None:
        volumes = self.root / "volumes"
        items: list[dict[str, object]] = [
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {
                    "name": STORAGE_CLASS,
                    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
                },
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "WaitForFirstConsumer",
                "reclaimPolicy": "Retain",
            }
        ]
        for i in range(VOLUMES):
            path = volumes / f"pv{i:02d}"
            path.mkdir(parents=True, exist_ok=True)
            items.append(local_volume(f"capstan-local-{i:02d}", NODE_NAME, path))
        for i in range(SECOND_VOLUMES):
            path = volumes / f"b-pv{i:02d}"
            path.mkdir(parents=True, exist_ok=True)
            items.append(local_volume(f"capstan-local-b-{i:02d}", SECOND.name, path))
        self.kubectl(
            "apply",
            "-f",
            "-",
            stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )

    def _node_ready(self, name: str) -> bool:
        out = self.kubectl(
            "get",
            "node",
            name,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return out.strip() == "True"

    def _pressures(self, name: str) -> list[str]:
        """The node's pressure conditions that hold (`DiskPressure: <the kubelet's message>`):
        a node under one is tainted, and pods wait unscheduled without saying why here."""
        out = self.kubectl("get", "node", name, "-o", "json", check=False)
        try:
            conditions = json.loads(out)["status"]["conditions"]
        except (ValueError, KeyError):
            return ["the node's conditions could not be read"]
        return [
            f"{c['type']}: {c.get('message', '')}"
            for c in conditions
            if c["type"].endswith("Pressure") and c["status"] == "True"
        ]

    def _wait_without_pressure(self, name: str) -> None:
        deadline = time.monotonic() + _PRESSURE_S
        while (pressures := self._pressures(name)) and time.monotonic() < deadline:
            time.sleep(1)
        if pressures:
            space = _free_space([self.root, docker_root()])
            raise NodeError(
                f"{name} is Ready but under {'; '.join(pressures)} for {_PRESSURE_S:.0f} s "
                f"(its eviction thresholds are 1 % free; {space}); free space on the machine"
            )

    # -- stop --

    def stop(self, progress: Callable[[str], None] = print) -> list[str]:
        """Stop everything and undo the machine's changes; returns what could not be undone
        (each step goes on after another failed)."""
        problems: list[str] = []

        def step(what: str, action: Callable[[], None]) -> None:
            try:
                action()
            except Exception as e:  # noqa: BLE001 - teardown goes on, and says what failed
                problems.append(f"{what}: {e}")

        held = (RECORD / "root").read_text().strip() if (RECORD / "root").exists() else None
        if held is not None and held != str(self.root):
            raise NodeError(f"this machine's node is held in {held}, not {self.root}")
        before = (
            json.loads((RECORD / "before.json").read_text())
            if (RECORD / "before.json").exists()
            else None
        )
        progress("== node: stopping kubelet and the pods' containers")
        for spec in (FIRST, SECOND):
            step(spec.folder, lambda name=spec.folder: self._kill(name))
        step("containers", self._remove_containers)
        step("the second node's pods", self._remove_pods_of_second)
        for name in reversed(COMPONENTS):
            if name not in (FIRST.folder, SECOND.folder):
                step(name, lambda name=name: self._kill(name))
        step("leftover processes", self._kill_leftovers)
        step("own children", self._wait_children)
        progress("== node: unmounting and undoing the machine's changes")
        step("mounts", self._unmount)
        if before is not None:
            step("iptables", lambda: _restore_iptables(before))
            step("sysctls", lambda: _restore_sysctls(before["sysctls"]))
            step("links", lambda: _remove_links(before["links"]))
            step("cgroups", lambda: _remove_cgroups(before["cgroups"]))
            step("files", lambda: _remove_paths(before["paths"]))
        else:
            step("links", lambda: _remove_links([]))
        if not problems and RECORD.exists():
            shutil.rmtree(RECORD)
        for p in problems:
            progress(f"error: node: could not undo {p}")
        if not problems:
            progress("== node: stopped, the machine as it was")
        return problems

    def _kill(self, name: str, timeout_s: float = 20) -> None:
        pid = self._pid(name)
        if pid is None or not self._alive(name):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._alive(name):
            self._reap(name)
            time.sleep(0.1)
        if self._alive(name):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            time.sleep(0.2)
        self._reap(name)

    def _wait_children(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        self._procs.clear()

    def _reap(self, name: str) -> None:
        """Collect an exited child of this process, so it stays no zombie."""
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is not None:
            del self._procs[name]

    def _remove_containers(self) -> None:
        if not self._alive("dockerd"):
            return
        ids = self._docker("ps", "-aq", check=False).split()
        if ids:
            self._docker("rm", "-f", *ids, check=False)

    def _remove_pods_of_second(self) -> None:
        if not self._alive("containerd-b"):
            return
        for task in self._ctr("tasks", "list", "-q", check=False).split():
            self._ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        time.sleep(0.5)
        for task in self._ctr("tasks", "list", "-q", check=False).split():
            self._ctr("tasks", "delete", "--force", task, check=False)
        for container in self._ctr("containers", "list", "-q", check=False).split():
            self._ctr("containers", "delete", container, check=False)

    def _cgroup_root(self, spec: KubeletSpec) -> None:
        """kubelet wants its cgroup root to exist in every hierarchy."""
        for controller in Path("/sys/fs/cgroup").iterdir():
            if controller.is_dir() and (controller / "cgroup.procs").exists():
                (controller / spec.cgroup_root.strip("/")).mkdir(exist_ok=True)

    def _kill_leftovers(self) -> None:
        """Container shims and pods' processes outlive dockerd: anything whose command line
        names DIR or the docker store goes."""
        marks = (str(self.root), str(docker_root()))
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                cmdline = (
                    (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except OSError:
                continue
            if any(m in cmdline for m in marks):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(proc.name), signal.SIGKILL)
        # Containers' own processes sit in kubepods/docker cgroups: kill what is left there.
        pods = [*Path("/sys/fs/cgroup").glob("*/kubepods*")]
        pods += Path("/sys/fs/cgroup").glob(f"*{SECOND.cgroup_root}/kubepods*")
        for group in pods:
            for tasks in group.rglob("cgroup.procs"):
                for pid in tasks.read_text().split():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(int(pid), signal.SIGKILL)

    def _unmount(self) -> None:
        marks = (str(self.root), str(docker_root()), *OUTSIDE_PATHS)
        for _ in range(3):
            points = []
            for line in Path("/proc/self/mounts").read_text().splitlines():
                point = line.split()[1].replace("\\040", " ")
                if any(point == m or point.startswith(m.rstrip("/") + "/") for m in marks):
                    points.append(point)
            if not points:
                return
            for point in sorted(points, key=len, reverse=True):
                subprocess.run(["umount", point], capture_output=True)
                if os.path.ismount(point):
                    subprocess.run(["umount", "-l", point], capture_output=True)
        raise NodeError("some mounts stayed")


def _running(root: Path) -> bool:
    """Whether any live process belongs to the node held in `root`: its components and the
    pods' shims all name DIR on their command lines."""
    mark = str(root)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if mark in cmdline and not _zombie(int(proc.name)):
            return True
    return False


def _zombie(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) == "Z"
    except (OSError, IndexError):
        return True


def _restore_iptables(before: dict[str, object]) -> None:
    for tool, key in (("iptables-restore", "iptables"), ("ip6tables-restore", "ip6tables")):
        saved = str(before.get(key) or "")
        if saved and shutil.which(tool):
            subprocess.run([tool], input=saved, text=True, capture_output=True, check=True)
    kept = set(before.get("nft_tables") or [])  # type: ignore[arg-type]
    for table in _nft_tables():
        if table not in kept:
            _run(["nft", "delete", "table", *table.split()[1:3]])


def _restore_sysctls(before: dict[str, str]) -> None:
    now = read_sysctls()
    for path, value in before.items():
        if path in now and now[path] != value:
            with contextlib.suppress(OSError):
                Path(path).write_text(value)


def _remove_links(before: list[str]) -> None:
    for name in _links():
        if name in before:
            continue
        if name in (NODE_BRIDGE, POD_BRIDGE, SECOND.pod_bridge) or name.startswith("veth"):
            _run(["ip", "link", "del", name], check=False)


def _remove_cgroups(before: list[str]) -> None:
    for controller in Path("/sys/fs/cgroup").iterdir():
        for name in CGROUP_NAMES:
            top = controller / name
            if str(top) in before or not top.is_dir():
                continue
            for sub in sorted(
                (p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True
            ):
                with contextlib.suppress(OSError):
                    sub.rmdir()
            top.rmdir()


def _remove_paths(before: list[str]) -> None:
    for path in OUTSIDE_PATHS:
        if path in before or not os.path.lexists(path):
            continue
        target = Path(path)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()


def user_environment(kubeconfig: Path) -> str:
    """The `export` line that sets a shell up for the node: the cluster's own kubectl
    (scripts/k8s_tools.sh builds it with the node) and Helm (scripts/chart_tools.sh), where
    built, on PATH, and the node's kubeconfig."""
    paths = [str(binaries())]
    helms = sorted(binaries().parents[2].glob("helm/*/helm"))  # ~/.cache/capstan/helm/VERSION
    paths += [str(helms[-1].parent)] if helms else []
    return f"export PATH={':'.join(paths)}:$PATH KUBECONFIG={kubeconfig}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests.kube.node", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    node = Node(args.dir)
    try:
        if args.action == "start":
            kubeconfig = node.start()
            print(f"== node: use it with: {user_environment(kubeconfig)}")
            print(kubeconfig, flush=True)
            return 0
        return 1 if node.stop() else 0
    except NodeError as e:
        print(f"error: node: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
