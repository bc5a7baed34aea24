"""The real node (tests/kube/node.py): pods of locally built images run on the real runtime
with the restricted security context enforced, reach each other by cluster DNS and Services,
keep a claim's data across a pod's deletion, reach nothing outside 198.18.0.0/15; one node
per machine; and its stop leaves the machine as it found it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube.node import (
    FIRST,
    RECORD,
    SECOND,
    SECOND_TAINT,
    Node,
    NodeError,
    snapshot,
    user_environment,
)
from tests.waiting import wait_until

# The first test's setup starts the node, which on a fresh machine builds the images first
# (about 8 minutes on 2 cores): far past the 300 s a test may take otherwise.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

NS = "node-test"
REPO = Path(__file__).resolve().parents[2]
RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": 10001,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
WEB = (
    "import http.server, socketserver\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'served')\n"
    "socketserver.TCPServer(('', 8080), H).serve_forever()\n"
)


@pytest.fixture(scope="module")
def machine_before() -> dict[str, object]:
    return snapshot()


@pytest.fixture(scope="module")
def node(
    tmp_path_factory: pytest.TempPathFactory, machine_before: dict[str, object]
) -> Iterator[Node]:
    running = Node(tmp_path_factory.mktemp("node"))
    running.start()
    running.kubectl("create", "namespace", NS)
    try:
        yield running
    finally:
        running.stop()


def _apply(node: Node, *items: dict[str, object]) -> None:
    node.kubectl(
        "apply",
        "-n",
        NS,
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)}),
    )


def _pod(name: str, command: list[str], **spec: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "local/debian:bookworm",
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": RESTRICTED,
                }
            ],
            **spec,
        },
    }


def _wait_phase(node: Node, pod: str, phases: set[str], timeout_s: float = 90) -> str:
    deadline = time.monotonic() + timeout_s
    phase = ""
    while time.monotonic() < deadline:
        phase = node.kubectl(
            "get", "pod", "-n", NS, pod, "-o", "jsonpath={.status.phase}", check=False
        ).strip()
        if phase in phases:
            return phase
        time.sleep(0.5)
    described = node.kubectl("describe", "pod", "-n", NS, pod, check=False)
    raise AssertionError(f"{pod} is {phase!r}, not {phases}: {described[-1500:]}")


def _wait_ready(node: Node, pod: str, timeout_s: float = 90) -> None:
    # `kubectl wait` fails at once on a pod not made yet (a StatefulSet's, under load).
    wait_until(
        lambda: node.kubectl("get", "pod", "-n", NS, pod, check=False).strip() != "",
        timeout_s,
        f"the pod {pod} made",
    )
    node.kubectl(
        "wait", "-n", NS, "--for=condition=Ready", f"pod/{pod}", f"--timeout={int(timeout_s)}s"
    )


def _web(node: Node) -> None:
    """The pod "web" on the first node and its Service, made by whichever test needs them
    first (each test also runs alone, with -k)."""
    _apply(
        node,
        _pod("web", ["python3", "-c", WEB]),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    _wait_ready(node, "web")


def test_a_pod_runs_on_the_real_runtime_with_the_restricted_context_enforced(node: Node):
    _web(node)
    assert node.kubectl("exec", "-n", NS, "web", "--", "id", "-u").strip() == "10001"
    refused = node.kubectl("exec", "-n", NS, "web", "--", "touch", "/written", check=False)
    assert refused == ""  # the write failed: nothing printed on stdout
    status = node.kubectl(
        "exec", "-n", NS, "web", "--", "sh", "-c", "touch /written; echo $?"
    ).strip()
    assert status != "0", "the root filesystem took a write"
    caps = node.kubectl("exec", "-n", NS, "web", "--", "grep", "CapEff", "/proc/self/status")
    assert caps.split()[1] == "0000000000000000"


def test_pods_reach_a_service_by_its_dns_name_through_kube_proxy(node: Node):
    _web(node)
    fetch = (
        "import time, urllib.request\n"
        "for _ in range(60):\n"
        "    try:\n"
        f"        url = 'http://web.{NS}.svc.cluster.local'\n"
        "        print(urllib.request.urlopen(url, timeout=2).read().decode())\n"
        "        break\n"
        "    except OSError as e:\n"
        "        print('retry', e); time.sleep(1)\n"
    )
    _apply(node, _pod("fetch", ["python3", "-c", fetch]))
    assert _wait_phase(node, "fetch", {"Succeeded", "Failed"}) == "Succeeded"
    assert node.kubectl("logs", "-n", NS, "fetch").strip().endswith("served")


def test_the_second_node_runs_only_pods_that_tolerate_it_and_its_pods_reach_the_firsts(
    node: Node,
):
    """The second node (its own kubelet and containerd, its own pod bridge and subnet): a pod
    that does not tolerate its taint never lands there; one that does runs with the
    restricted context enforced, the two nodes' pods reach each other both ways, by
    address and by a Service's DNS name, and both nodes' pod logs outlive the kubelets'
    garbage collection."""
    on_second = {
        "nodeSelector": {"kubernetes.io/hostname": SECOND.name},
        "tolerations": [{"key": SECOND_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    }
    _apply(
        node,
        _pod("web-b", ["python3", "-c", WEB], **on_second),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web-b"},
            "spec": {"selector": {"app": "web-b"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        _pod("untolerated", ["sleep", "600"], nodeSelector={"kubernetes.io/hostname": SECOND.name}),
    )
    _wait_ready(node, "web-b")
    placed = json.loads(node.kubectl("get", "pod", "-n", NS, "web-b", "-o", "json"))
    assert placed["spec"]["nodeName"] == SECOND.name
    assert placed["status"]["podIP"].startswith(SECOND.pod_cidr.rsplit(".", 1)[0] + ".")
    assert node.kubectl("exec", "-n", NS, "web-b", "--", "id", "-u").strip() == "10001"
    _web(node)
    fetch = (
        "import sys, time, urllib.request\n"
        "for _ in range(60):\n"
        "    try:\n"
        "        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())\n"
        "        break\n"
        "    except OSError as e:\n"
        "        print('retry', e); time.sleep(1)\n"
    )
    web_ip = node.kubectl("get", "pod", "-n", NS, "web", "-o", "jsonpath={.status.podIP}")
    _apply(
        node,
        _pod("from-b", ["python3", "-c", fetch, f"http://web.{NS}.svc.cluster.local"], **on_second),
        _pod("from-b-ip", ["python3", "-c", fetch, f"http://{web_ip}:8080"], **on_second),
        _pod("to-b", ["python3", "-c", fetch, f"http://web-b.{NS}.svc.cluster.local"]),
    )
    for pod in ("from-b", "from-b-ip", "to-b"):
        assert _wait_phase(node, pod, {"Succeeded", "Failed"}) == "Succeeded", pod
        assert node.kubectl("logs", "-n", NS, pod).strip().endswith("served"), pod
    # Each kubelet's garbage collector (once a minute) removes the log folders of pods it
    # does not run: the two nodes keep theirs apart, so both stay readable.
    time.sleep(65)
    for pod in ("from-b", "to-b"):
        assert node.kubectl("logs", "-n", NS, pod).strip().endswith("served"), pod
    waiting = json.loads(node.kubectl("get", "pod", "-n", NS, "untolerated", "-o", "json"))
    assert not waiting["spec"].get("nodeName"), "a pod that does not tolerate the taint ran there"
    node.kubectl("delete", "pod", "-n", NS, "untolerated", "--wait=false")


def test_a_pod_reaches_nothing_outside_the_test_addresses_and_dns_never_forwards(node: Node):
    probe = (
        "import socket, errno\n"
        "s = socket.socket()\n"
        "try:\n"
        "    s.connect(('192.0.2.1', 80))\n"
        "except OSError as e:\n"
        "    print('connect', errno.errorcode.get(e.errno))\n"
        "try:\n"
        "    socket.gethostbyname('example.com')\n"
        "except OSError as e:\n"
        "    print('resolve failed')\n"
    )
    _apply(node, _pod("probe", ["python3", "-c", probe]))
    _wait_phase(node, "probe", {"Succeeded", "Failed"})
    out = node.kubectl("logs", "-n", NS, "probe")
    assert "connect ENETUNREACH" in out
    assert "resolve failed" in out


def test_the_runtime_never_pulls_a_missing_image_fails_here_and_says_so(node: Node):
    """A pull (what the kubelet asks for when a pod names an image the store lacks) goes to
    dockerd's proxy on a closed loopback port: refused at once, nothing looked up or sent
    off the machine; the pod's status names the image."""
    pulled = subprocess.run(
        ["docker", "--host", f"unix://{node.root / 'docker.sock'}", "pull", "local/none:1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert pulled.returncode != 0
    assert "proxyconnect tcp" in pulled.stderr and "127.0.0.1:9" in pulled.stderr, pulled.stderr
    pod = _pod("absent", ["true"])
    container = pod["spec"]["containers"][0]  # type: ignore[index]
    container.update(image="local/none:1", imagePullPolicy="IfNotPresent")
    _apply(node, pod)

    def waiting_reason() -> str:
        found = json.loads(node.kubectl("get", "pod", "-n", NS, "absent", "-o", "json"))
        for cs in found["status"].get("containerStatuses") or []:
            reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason", "")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                return str(reason)
        return ""

    wait_until(waiting_reason, 60, "the pod waiting on its image")


def test_building_the_images_again_leaves_no_untagged_image_in_the_store(
    node: Node, tmp_path: Path
):
    """The store outlives nodes (~/.cache): an image rebuilt under its tag leaves the old one
    untagged, and scripts/k8s_images.sh removes those, keeping every tagged image."""
    docker = ["docker", "--host", f"unix://{node.root / 'docker.sock'}"]
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY content /content\n")
    for content in ("first", "second"):  # the second build takes the tag from the first
        (tmp_path / "content").write_text(content)
        subprocess.run(
            [*docker, "build", "--network=none", "-t", "local/rebuilt:1", str(tmp_path)],
            check=True, capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "0"},
        )  # fmt: skip

    def images(*args: str) -> list[str]:
        listed = subprocess.run(
            [*docker, "images", "--format", "{{.Repository}}:{{.Tag}}", *args],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        return sorted(listed.stdout.split())

    assert images("--filter", "dangling=true") == ["<none>:<none>"]
    tagged = images("--filter", "dangling=false")
    script = REPO / "scripts" / "k8s_images.sh"
    env = {**os.environ, "DOCKER_HOST": f"unix://{node.root / 'docker.sock'}"}
    built = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert "untagged images removed" in built.stdout
    assert images("--filter", "dangling=true") == []
    assert images("--filter", "dangling=false") == tagged
    subprocess.run([*docker, "rmi", "local/rebuilt:1"], check=True, capture_output=True)


def test_a_stateful_pod_finds_its_claims_data_after_its_deletion_and_resolves_by_name(node: Node):
    keep = (
        "import pathlib, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"  # PID 1 ignores it otherwise
        "p = pathlib.Path('/data/count')\n"
        "n = int(p.read_text()) + 1 if p.exists() else 1\n"
        "p.write_text(str(n))\n"
        "print('count', n, flush=True)\n"
        "time.sleep(3600)\n"
    )
    _apply(
        node,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kept"},
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": {"app": "kept"},
                "ports": [{"port": 80}],
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "kept"},
            "spec": {
                "serviceName": "kept",
                "replicas": 1,
                "selector": {"matchLabels": {"app": "kept"}},
                "template": {
                    "metadata": {"labels": {"app": "kept"}},
                    "spec": {
                        "securityContext": {"fsGroup": 10001},
                        "containers": [
                            {
                                "name": "main",
                                "image": "local/debian:bookworm",
                                "imagePullPolicy": "Never",
                                "command": ["python3", "-c", keep],
                                "securityContext": RESTRICTED,
                                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                            }
                        ],
                    },
                },
                "volumeClaimTemplates": [
                    {
                        "metadata": {"name": "data"},
                        "spec": {
                            "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "1Gi"}},
                        },
                    }
                ],
            },
        },
    )
    _wait_ready(node, "kept-0", 120)
    assert "count 1" in node.kubectl("logs", "-n", NS, "kept-0")
    node.kubectl("delete", "pod", "-n", NS, "kept-0", "--wait=false")
    # Then "count 2" below: the StatefulSet made the pod again, on the same claim.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if "count 2" in node.kubectl("logs", "-n", NS, "kept-0", check=False):
            break
        time.sleep(1)
    assert "count 2" in node.kubectl("logs", "-n", NS, "kept-0")
    resolve = f"import socket; print(socket.gethostbyname('kept-0.kept.{NS}.svc.cluster.local'))"
    _apply(node, _pod("resolve", ["python3", "-c", resolve]))
    assert _wait_phase(node, "resolve", {"Succeeded", "Failed"}) == "Succeeded"
    ip = node.kubectl("get", "pod", "-n", NS, "kept-0", "-o", "jsonpath={.status.podIP}").strip()
    assert node.kubectl("logs", "-n", NS, "resolve").strip() == ip


def readme_quickstart() -> tuple[str, str]:
    """The README's two Kubernetes blocks: starting the project's node, then the commands a
    user types on a cluster (run here as written)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Run on Kubernetes") :]
    section = section[: section.index("\n## ", 1)]
    node_block, commands = re.findall(r"```bash\n(.*?)```", section, re.DOTALL)
    return node_block, commands


def test_the_readmes_quickstart_runs_as_written_and_a_client_sends_and_receives(
    node: Node, tmp_path: Path
):
    node_block, commands = readme_quickstart()
    # The README's export line is the one `k8s_node.sh start` prints, for the README's folder.
    readme_dir = re.search(r"k8s_node\.sh start (\S+)", node_block)
    assert readme_dir, node_block
    printed = user_environment(Path(readme_dir.group(1)) / "kubeconfig")
    assert printed.replace(str(Path.home()), "$HOME") in node_block.splitlines()
    env = {
        **os.environ,
        # Helm's own state in the test's folder, not the user's home.
        **{
            f"HELM_{part}_HOME": str(tmp_path / part.lower())
            for part in ("CACHE", "CONFIG", "DATA")
        },
    }
    script = f"set -euo pipefail\n{user_environment(node.kubeconfig)}\n{commands}"
    try:
        ran = subprocess.run(
            ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=1200,
        )  # fmt: skip
        job_log = node.kubectl("logs", "-n", "shop", "job/first-messages", check=False)
        assert ran.returncode == 0, (
            ran.stdout[-3000:] + ran.stderr + job_log[-3000:] + _events(node)
        )
        sent = re.findall(r"^sent (\S+) to queue", ran.stdout, re.MULTILINE)
        received = re.findall(r"^(\S+) broker-a queue \d+@\d+ attempt 1: hello from shop$",
                              ran.stdout, re.MULTILINE)  # fmt: skip
        assert len(sent) == 10 and sorted(received) == sorted(sent), ran.stdout
    finally:
        # The operator removes what it made while it still runs: the namespace first.
        node.kubectl(
            "delete", "namespace", "shop", "--ignore-not-found", "--timeout=180s", timeout_s=200
        )
        subprocess.run(
            ["bash", "-c", f"{user_environment(node.kubeconfig)}\n"
             "helm uninstall capstan --namespace capstan --wait --timeout 120s"],
            env=env, capture_output=True, timeout=180,
        )  # fmt: skip
        node.kubectl(
            "delete", "namespace", "capstan", "--ignore-not-found", "--timeout=180s", timeout_s=200
        )
        node.kubectl(
            "delete", "-f", str(REPO / "charts" / "capstan" / "crds"), "--ignore-not-found"
        )


def _events(node: Node) -> str:
    return node.kubectl("get", "events", "-A", "--sort-by=.lastTimestamp", check=False)[-4000:]


def test_a_second_cluster_on_the_same_machine_is_refused_naming_the_first(
    node: Node, tmp_path: Path
):
    with pytest.raises(NodeError, match=str(node.root)):
        Node(tmp_path / "second").start(progress=lambda _: None)
    assert (RECORD / "root").read_text().strip() == str(node.root)


def test_stop_leaves_the_machine_as_it_was(node: Node, machine_before: dict[str, object]):
    assert node.stop() == []
    after = snapshot()
    for key in ("nft_tables", "links", "cgroups", "paths", "iptables", "ip6tables"):
        assert after[key] == machine_before[key], key
    changed = {
        k: (v, after["sysctls"].get(k))  # type: ignore[attr-defined]
        for k, v in machine_before["sysctls"].items()  # type: ignore[attr-defined]
        if after["sysctls"].get(k) != v  # type: ignore[attr-defined]
    }
    assert changed == {}
    assert not RECORD.exists()


def test_a_node_that_died_without_a_stop_is_undone_by_the_next_start(
    tmp_path_factory: pytest.TempPathFactory, machine_before: dict[str, object]
):
    dead = Node(tmp_path_factory.mktemp("dead-node"))
    dead.start(progress=lambda _: None)
    # What a restarted machine or a killed run leaves: every process gone, every change kept.
    dead._kill_leftovers()
    dead._wait_children()
    assert RECORD.exists()
    said: list[str] = []
    second = Node(tmp_path_factory.mktemp("next-node"))
    try:
        second.start(progress=said.append)
        assert any(f"the node of {dead.root} died without a stop" in line for line in said)
        out = second.kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")
        assert out.split() == [FIRST.name, SECOND.name]
    finally:
        assert second.stop(progress=lambda _: None) == []
    after = snapshot()
    for key in ("nft_tables", "links", "cgroups", "paths", "iptables", "ip6tables"):
        assert after[key] == machine_before[key], key
    assert not RECORD.exists()
