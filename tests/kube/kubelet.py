"""A test kubelet: runs the Pods of a real API server as local processes.

There is no kubelet, scheduler, container engine or cluster DNS on these machines. This
test tool stands in for them, doing what a kubelet does that Capstan's operator and
brokers can notice:

- registers a Node and keeps its Ready condition fresh;
- binds every unscheduled Pod to that Node (the scheduler's one decision here);
- gives each Pod its own address, 198.18.0.N on this machine's loopback device
  (`PodNetwork`: machine-local like 127.0.0.1, but an address the API server accepts in a
  Service's Endpoints), as its Pod IP, so every pod can listen on the same ports, and
  writes `<hostname>.<subdomain>.<namespace>.svc[.cluster.local]` and
  `<name>.<namespace>.svc...` of every running Pod into a hosts file; run inside a mount
  namespace where that file is /etc/hosts (`HostsNamespace`), processes resolve the stable
  DNS names a StatefulSet's headless Service gives (gRPC's resolvers read /etc/hosts);
- stands in for kube-proxy too: a ClusterIP Service's name `<service>.<namespace>.svc`
  leads to a stable address of its own (127.0.1.N) whose ports forward each connection to
  a ready pod (tests/kube/service_proxy.py), so clients start from a Service's address
  and reconnect through it when a pod goes;
- runs the first container's command and args as a process (the image is not pulled: the
  command runs from `bin_dirs`, e.g. the venv's `capstan`), with the env of its `value`s and
  downward-API `fieldRef`s (metadata.name, metadata.namespace, status.podIP, spec.nodeName),
  and its volumes as directories: a ConfigMap's or Secret's keys as files, an emptyDir per Pod, a
  PersistentVolumeClaim per claim name that outlives its Pod (a restarted pod-0 finds its
  data); mount paths in the command, args and env are rewritten to those directories;
- runs exec, tcpSocket and httpGet readiness and liveness probes and writes Pod status:
  phase, podIP, conditions (PodScheduled, Initialized, ContainersReady, Ready) and the
  container's state and restartCount; restarts an exited or unhealthy container under
  restartPolicy Always, with a growing back-off;
- gives a Pod with a service account (unless automountServiceAccountToken is false) a
  token bound to it from the TokenRequest API, as a kubeconfig in $KUBECONFIG where a
  kubelet would mount the projected token: the pod acts with its account's RBAC rights;
- honours deletion: SIGTERM to the process group, SIGKILL after the grace period, then
  removes the Pod (a delete with grace period 0), as a kubelet confirms a Pod's end.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client import ApiException

from tests.kube.service_proxy import Backends, PortForward
from tests.tiers import process_tool

log = logging.getLogger(__name__)

NODE = "capstan-test-node"
_POLL_S = 0.25
_NODE_HEARTBEAT_S = 10.0
_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Probe:
    spec: Any
    failures: int = 0
    successes: int = 0
    next_at: float = 0.0


@dataclass
class _RunningPod:
    uid: str
    namespace: str
    name: str
    container: str
    ip: str
    dns_names: list[str]
    argv: list[str]
    env: dict[str, str]
    workdir: Path
    log_path: Path
    readiness: _Probe | None
    liveness: _Probe | None
    always_restart: bool
    process: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    started_mono: float = 0.0
    ready: bool = False
    restarts: int = 0
    restart_at: float = 0.0
    last_exit: int | None = None
    terminating_since: float | None = None
    grace_s: float = 30.0
    status_written: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    named_ports: dict[str, int] = field(default_factory=dict)
    """The container's ports by name, which probes may use instead of numbers."""

    def port(self, port: int | str) -> int:
        return self.named_ports[port] if isinstance(port, str) and not port.isdigit() else int(port)


@process_tool
class TestKubelet:
    """Runs in a thread of the test process (`start()` / `stop()`)."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        api: client.ApiClient,
        work_dir: Path,
        hosts_file: Path,
        bin_dirs: Sequence[Path],
        extra_env: dict[str, str] | None = None,
        command_prefix: Sequence[str] = (),
    ) -> None:
        """`command_prefix` runs before every pod's command (e.g. an `nsenter` into the
        hosts namespace); `extra_env` is added to every pod's env (e.g. PATH)."""
        self._core = client.CoreV1Api(api)
        self._work = work_dir
        self._hosts = hosts_file
        self._bin_dirs = list(bin_dirs)
        self._extra_env = dict(extra_env or {})
        self._prefix = list(command_prefix)
        self._pods: dict[str, _RunningPod] = {}
        self._service_routes: dict[str, str] = {}
        self._services: dict[str, tuple[str, list[PortForward]]] = {}
        self._retired_vips = 0
        self._ips: dict[str, str] = {}
        self._next_ip = 10
        self._network = PodNetwork()
        self._start_again_at: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-kubelet", daemon=True)
        self._node_beat = 0.0
        self.errors: list[str] = []

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._work.mkdir(parents=True, exist_ok=True)
        self._network.open()
        self._write_hosts()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        for pod in list(self._pods.values()):
            self._kill(pod, grace_s=5.0)
        for _, forwards in self._services.values():
            for forward in forwards:
                forward.close()
        self._network.close()

    def pod_ip(self, namespace: str, name: str) -> str | None:
        for pod in self._pods.values():
            if (pod.namespace, pod.name) == (namespace, name):
                return pod.ip
        return None

    def signal(self, namespace: str, name: str, signum: int) -> bool:
        """Send `signum` to the pod's container process (SIGSTOP: a hung container, which
        a kubelet would only notice through its probes); False when none runs."""
        for pod in self._pods.values():
            if (pod.namespace, pod.name) == (namespace, name) and pod.process is not None:
                try:
                    pod.process.send_signal(signum)
                except ProcessLookupError:
                    return False
                return pod.process.poll() is None
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except Exception as exc:  # keep serving; the test reads `errors`
                log.exception("test kubelet round failed")
                self.errors.append(repr(exc))
            self._stop.wait(_POLL_S)

    def _round(self) -> None:
        now = time.monotonic()
        if now - self._node_beat >= _NODE_HEARTBEAT_S:
            self._register_node()
            self._node_beat = now
        listed = self._core.list_pod_for_all_namespaces().items
        seen = set()
        for pod in listed:
            uid = pod.metadata.uid
            seen.add(uid)
            if not pod.spec.node_name:
                if pod.metadata.deletion_timestamp is None:
                    self._bind(pod)
                continue
            if pod.spec.node_name != NODE:
                continue
            running = self._pods.get(uid)
            if pod.metadata.deletion_timestamp is not None:
                self._terminate(pod, running)
                continue
            if running is None:
                if now < self._start_again_at.get(uid, 0.0):
                    continue
                try:
                    running = self._start_pod(pod)
                except ApiException as exc:
                    # A volume it cannot have yet (a Secret not made, no token in a namespace
                    # being deleted): a kubelet leaves the pod waiting and tries again.
                    log.info("pod %s/%s waits: %s", pod.metadata.namespace, pod.metadata.name, exc)
                    self._start_again_at[uid] = now + 2.0
                    continue
            self._tend(running)
            self._write_status(running)
        for uid in [u for u in self._pods if u not in seen]:
            self._kill(self._pods.pop(uid), grace_s=0.0)
            self._write_hosts()
        self._route_services()

    def _route_services(self) -> None:
        """kube-proxy's part: each ClusterIP Service with a selector gets a stable address
        (127.0.1.N) whose ports forward to its ready pods (tests/kube/service_proxy.py)."""
        routes: dict[str, str] = {}
        seen = set()
        for service in self._core.list_service_for_all_namespaces().items:
            spec, meta = service.spec, service.metadata
            if spec.cluster_ip in (None, "None") or not spec.selector:
                continue
            seen.add(meta.uid)
            if meta.uid not in self._services:
                vip = f"127.0.1.{len(self._services) + self._retired_vips + 10}"
                forwards = [
                    PortForward(vip, port.port, self._backends(meta.namespace, spec.selector, port))
                    for port in spec.ports or ()
                ]
                self._services[meta.uid] = (vip, forwards)
            routes[f"{meta.name}.{meta.namespace}.svc"] = self._services[meta.uid][0]
        for uid in [u for u in self._services if u not in seen]:
            for forward in self._services.pop(uid)[1]:
                forward.close()
            self._retired_vips += 1
        if routes != self._service_routes:
            self._service_routes = routes
            self._write_hosts()

    def _backends(self, namespace: str, selector: dict[str, str], port: Any) -> Backends:
        target = port.target_port if port.target_port is not None else port.port

        def ready() -> list[tuple[str, int]]:
            return sorted(
                (p.ip, p.port(target))
                for p in list(self._pods.values())
                if p.namespace == namespace
                and p.ready
                and p.terminating_since is None
                and selector.items() <= p.labels.items()
            )

        return ready

    # -- node and binding ----------------------------------------------------------------

    def _register_node(self) -> None:
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "test kubelet is posting ready status",
            "lastHeartbeatTime": _now(),
            "lastTransitionTime": _now(),
        }
        try:
            self._core.read_node(NODE)
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}},
                "spec": {},
            }
            self._core.create_node(body)
        self._core.patch_node_status(NODE, {"status": {"conditions": [ready]}})

    def _bind(self, pod: Any) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=pod.metadata.name),
            target=client.V1ObjectReference(kind="Node", api_version="v1", name=NODE),
        )
        try:
            self._core.create_namespaced_pod_binding(
                pod.metadata.name, pod.metadata.namespace, body, _preload_content=False
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    # -- starting ------------------------------------------------------------------------

    def _ip_for(self, uid: str) -> str:
        ip = self._ips.get(uid)
        if ip is None:
            used = {p.ip for p in self._pods.values()}
            while f"{self._network.prefix}{self._next_ip}" in used:
                self._next_ip += 1
            ip = self._ips[uid] = f"{self._network.prefix}{self._next_ip}"
            self._next_ip = self._next_ip + 1 if self._next_ip < 250 else 10
            self._network.add(ip)
        return ip

    def _start_pod(self, pod: Any) -> _RunningPod:
        meta, spec = pod.metadata, pod.spec
        ip = self._ip_for(meta.uid)
        home = self._work / "pods" / meta.namespace / f"{meta.name}-{meta.uid[:8]}"
        home.mkdir(parents=True, exist_ok=True)
        mounts = self._volumes(pod, home)
        container = spec.containers[0]
        paths = {m.mount_path: mounts[m.name] for m in container.volume_mounts or ()}
        fields = {
            "metadata.name": meta.name,
            "metadata.namespace": meta.namespace,
            "status.podIP": ip,
            "spec.nodeName": NODE,
        }
        env: dict[str, str] = self._service_account(pod, home)
        for var in container.env or ():
            if var.value_from is not None and var.value_from.field_ref is not None:
                env[var.name] = fields.get(var.value_from.field_ref.field_path, "")
            elif var.value is not None:
                env[var.name] = _expand(_rewrite(var.value, paths), env)
        argv = [
            _expand(_rewrite(a, paths), env)
            for a in [*(container.command or ()), *(container.args or ())]
        ]
        if not argv:
            raise ValueError(f"pod {meta.namespace}/{meta.name}: no command (images are not run)")
        argv[0] = self._which(argv[0])
        names = [f"{meta.name}.{meta.namespace}.svc"]
        if spec.hostname and spec.subdomain:
            names.insert(0, f"{spec.hostname}.{spec.subdomain}.{meta.namespace}.svc")
        dns = [n for name in names for n in (name, f"{name}.cluster.local")]
        grace = spec.termination_grace_period_seconds
        running = _RunningPod(
            uid=meta.uid,
            namespace=meta.namespace,
            name=meta.name,
            container=container.name,
            ip=ip,
            dns_names=dns,
            argv=argv,
            env=env,
            workdir=home,
            log_path=home / "container.log",
            readiness=_Probe(container.readiness_probe) if container.readiness_probe else None,
            liveness=_Probe(container.liveness_probe) if container.liveness_probe else None,
            always_restart=(spec.restart_policy or "Always") == "Always",
            grace_s=30.0 if grace is None else float(grace),
            labels=dict(meta.labels or {}),
            named_ports={p.name: p.container_port for p in container.ports or () if p.name},
        )
        self._pods[meta.uid] = running
        self._write_hosts()
        self._spawn(running)
        return running

    def _service_account(self, pod: Any, home: Path) -> dict[str, str]:
        """What a kubelet's projected service-account token gives a pod, as a kubeconfig
        in $KUBECONFIG (clients fall back to it when not in a cluster): a token bound to
        the Pod, asked of the TokenRequest API, so the pod acts with its account's rights."""
        meta, spec = pod.metadata, pod.spec
        if not spec.service_account_name or spec.automount_service_account_token is False:
            return {}
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[],
                expiration_seconds=3600,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=meta.name, uid=meta.uid
                ),
            )
        )
        token = self._core.create_namespaced_service_account_token(
            spec.service_account_name, meta.namespace, request
        ).status.token
        api = self._core.api_client.configuration
        account = f"system:serviceaccount:{meta.namespace}:{spec.service_account_name}"
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "cluster",
                    "cluster": {"server": api.host, "certificate-authority": api.ssl_ca_cert},
                }
            ],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {"cluster": "cluster", "user": account, "namespace": meta.namespace},
                }
            ],
            "current-context": "pod",
        }
        path = home / "serviceaccount" / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(kubeconfig))
        path.chmod(0o600)
        return {"KUBECONFIG": str(path)}

    def _which(self, command: str) -> str:
        if "/" in command:
            return command
        for folder in self._bin_dirs:
            if (folder / command).exists():
                return str(folder / command)
        return command

    def _volumes(self, pod: Any, home: Path) -> dict[str, Path]:
        out: dict[str, Path] = {}
        namespace = pod.metadata.namespace
        for volume in pod.spec.volumes or ():
            files: dict[str, bytes] | None = None
            if volume.config_map is not None:
                found = self._core.read_namespaced_config_map(volume.config_map.name, namespace)
                files = {k: v.encode() for k, v in (found.data or {}).items()}
            elif volume.secret is not None:
                secret = self._core.read_namespaced_secret(volume.secret.secret_name, namespace)
                files = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
            if files is not None:  # a ConfigMap's or Secret's keys, one file each
                folder = home / "volumes" / volume.name
                folder.mkdir(parents=True, exist_ok=True)
                for key, content in files.items():
                    (folder / key).write_bytes(content)
                    (folder / key).chmod(0o600 if volume.secret is not None else 0o644)
                out[volume.name] = folder
            elif volume.persistent_volume_claim is not None:
                claim = volume.persistent_volume_claim.claim_name
                folder = self._work / "claims" / pod.metadata.namespace / claim
                folder.mkdir(parents=True, exist_ok=True)
                out[volume.name] = folder
            else:  # emptyDir and anything else: a folder of the pod's own
                folder = home / "volumes" / volume.name
                folder.mkdir(parents=True, exist_ok=True)
                out[volume.name] = folder
        # volumeClaimTemplates become claims named <template>-<pod>; the StatefulSet puts
        # them into the pod as persistentVolumeClaim volumes, handled above.
        return out

    def _spawn(self, pod: _RunningPod) -> None:
        env = {**os.environ, **self._extra_env, **pod.env}
        out = pod.log_path.open("ab")
        out.write(f"--- start {_now()}: {shlex.join(pod.argv)}\n".encode())
        out.flush()
        pod.process = subprocess.Popen(
            [*self._prefix, *pod.argv],
            cwd=pod.workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        pod.started_at = _now()
        pod.started_mono = time.monotonic()
        pod.ready = pod.readiness is None
        for probe in (pod.readiness, pod.liveness):
            if probe is not None:
                probe.failures = probe.successes = 0
                delay = probe.spec.initial_delay_seconds or 0
                probe.next_at = time.monotonic() + delay

    # -- tending -------------------------------------------------------------------------

    def _tend(self, pod: _RunningPod) -> None:
        process = pod.process
        now = time.monotonic()
        if process is None:
            if pod.always_restart and now >= pod.restart_at:
                pod.restarts += 1
                self._spawn(pod)
            return
        code = process.poll()
        if code is not None:
            pod.process = None
            pod.ready = False
            pod.last_exit = code
            step = _BACKOFF_S[min(pod.restarts, len(_BACKOFF_S) - 1)]
            pod.restart_at = now + step
            return
        if pod.readiness is not None and now >= pod.readiness.next_at:
            pod.ready = self._probe(pod, pod.readiness, pod.ready)
        if pod.liveness is not None and now >= pod.liveness.next_at:
            alive = self._probe(pod, pod.liveness, True)
            if not alive:
                self._kill(pod, grace_s=pod.grace_s)
                pod.process = None
                pod.ready = False
                pod.restart_at = now

    def _probe(self, pod: _RunningPod, probe: _Probe, current: bool) -> bool:
        spec = probe.spec
        probe.next_at = time.monotonic() + (spec.period_seconds or 10)
        ok = self._check(pod, spec)
        if ok:
            probe.successes += 1
            probe.failures = 0
            return current or probe.successes >= (spec.success_threshold or 1)
        probe.failures += 1
        probe.successes = 0
        return current and probe.failures < (spec.failure_threshold or 3)

    def _check(self, pod: _RunningPod, spec: Any) -> bool:
        timeout = float(spec.timeout_seconds or 1)
        exec_action = getattr(spec, "_exec", None)
        if exec_action is not None:
            env = {**os.environ, **self._extra_env, **pod.env}
            argv = list(exec_action.command)
            argv[0] = self._which(argv[0])
            try:
                done = subprocess.run(
                    [*self._prefix, *argv],
                    env=env,
                    cwd=pod.workdir,
                    capture_output=True,
                    timeout=timeout + 5,
                )
            except subprocess.TimeoutExpired:
                return False
            return done.returncode == 0
        if spec.tcp_socket is not None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection((pod.ip, pod.port(spec.tcp_socket.port)), timeout),
            ):
                return True
            return False
        if spec.http_get is not None:
            url = f"http://{pod.ip}:{pod.port(spec.http_get.port)}{spec.http_get.path or '/'}"
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(url, timeout=timeout) as reply,
            ):
                return 200 <= reply.status < 400
            return False
        return True

    # -- ending --------------------------------------------------------------------------

    def _terminate(self, pod: Any, running: _RunningPod | None) -> None:
        grace = pod.metadata.deletion_grace_period_seconds
        if running is not None:
            self._kill(running, grace_s=30.0 if grace is None else float(grace))
            self._pods.pop(running.uid, None)
            self._write_hosts()
        with contextlib.suppress(ApiException):
            self._core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0,
                    preconditions=client.V1Preconditions(uid=pod.metadata.uid),
                ),
            )

    def _kill(self, pod: _RunningPod, grace_s: float) -> None:
        process = pod.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    # -- status and names ----------------------------------------------------------------

    def _write_status(self, pod: _RunningPod) -> None:
        running = pod.process is not None
        ready = "True" if running and pod.ready else "False"
        if running:
            state: dict[str, Any] = {"running": {"startedAt": pod.started_at}}
        else:
            state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"exited with code {pod.last_exit}",
                }
            }
        status = {
            "phase": "Running",
            "podIP": pod.ip,
            "podIPs": [{"ip": pod.ip}],
            "hostIP": "127.0.0.1",
            "startTime": pod.started_at,
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
            ],
            "containerStatuses": [
                {
                    "name": pod.container,
                    "ready": ready == "True",
                    "started": running,
                    "restartCount": pod.restarts,
                    "image": "capstan",
                    "imageID": "",
                    "state": state,
                }
            ],
        }
        key = {"ready": ready, "running": running, "restarts": pod.restarts, "ip": pod.ip}
        if key == pod.status_written:
            return
        with contextlib.suppress(ApiException):
            self._core.patch_namespaced_pod_status(pod.name, pod.namespace, {"status": status})
            pod.status_written = key

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost"]
        lines += [f"{pod.ip}\t{' '.join(pod.dns_names)}" for pod in self._pods.values()]
        lines += [f"{ip}\t{name} {name}.cluster.local" for name, ip in self._service_routes.items()]
        text = "\n".join(lines) + "\n"
        # In place: a bind mount of this file over /etc/hosts sees the same inode.
        with self._hosts.open("r+" if self._hosts.exists() else "w") as f:
            f.seek(0)
            f.write(text)
            f.truncate()


def _rewrite(text: str, paths: dict[str, Path]) -> str:
    """Mount paths in `text` replaced by their folders, in one pass (a folder's own path,
    e.g. under /tmp, is never rewritten again by a mount at /tmp), each only as a whole
    path or a path's leading part."""
    if not paths:
        return text
    mounts = sorted(paths, key=len, reverse=True)
    pattern = "|".join(re.escape(m.rstrip("/")) for m in mounts)
    return re.sub(
        rf"(?<![\w./-])({pattern})(?=/|$|[^\w.-])",
        lambda m: str(paths.get(m.group(1)) or paths[m.group(1) + "/"]),
        text,
    )


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) references to earlier env entries."""
    for name, value in env.items():
        text = text.replace(f"$({name})", value)
    return text


class PodNetwork:
    """Where pods get their addresses: 198.18.0.N/32 (RFC 2544's range for benchmarks in a
    lab: never routed) added to this machine's loopback device by `add()` and removed by
    `close()`. Traffic to them stays on this machine, as it does to 127.0.0.1. Loopback
    addresses (127.0.0.0/8) cannot be pod IPs: the API server refuses them in Endpoints,
    so a Service (and a webhook behind one) would never find its pods. Without the right to
    add addresses (CAP_NET_ADMIN) pods get 127.0.0.N, and Services get no endpoints."""

    DEVICE = "lo"

    def __init__(self) -> None:
        self.prefix = "198.18.0."
        self._added: list[str] = []

    def open(self) -> None:
        for ip in self._present():  # left by a run that was killed
            self._ip("addr", "del", f"{ip}/32", "dev", self.DEVICE)
        probe = f"{self.prefix}254"
        if self._ip("addr", "add", f"{probe}/32", "dev", self.DEVICE).returncode != 0:
            log.warning("cannot add pod addresses to %s; using 127.0.0.N", self.DEVICE)
            self.prefix = "127.0.0."
            return
        self._ip("addr", "del", f"{probe}/32", "dev", self.DEVICE)

    def add(self, ip: str) -> None:
        if ip.startswith("127.") or ip in self._added:
            return
        done = self._ip("addr", "add", f"{ip}/32", "dev", self.DEVICE)
        if done.returncode != 0 and "File exists" not in done.stderr:
            raise RuntimeError(f"cannot add pod address {ip}: {done.stderr.strip()}")
        self._added.append(ip)

    def close(self) -> None:
        for ip in self._added:
            self._ip("addr", "del", f"{ip}/32", "dev", self.DEVICE)
        self._added.clear()

    def _present(self) -> list[str]:
        shown = self._ip("-o", "-4", "addr", "show", "dev", self.DEVICE).stdout
        return [
            word.split("/")[0]
            for word in shown.split()
            if word.startswith(self.prefix) and word.endswith("/32")
        ]

    @staticmethod
    def _ip(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def running_kubelet(
    api: client.ApiClient, work_dir: Path
) -> Iterator[tuple[TestKubelet, list[str]]]:
    """A started TestKubelet running pods from this venv, and the command prefix that runs a
    command where its pods are: a mount namespace that sees `work_dir/hosts` as /etc/hosts.
    Pods keep their folders under `work_dir/kubelet`. Stopped on exit."""
    hosts = work_dir / "hosts"
    with hosts_namespace(hosts) as enter:
        kubelet = TestKubelet(
            api, work_dir / "kubelet", hosts, [Path(sys.executable).parent], command_prefix=enter
        )
        kubelet.start()
        try:
            yield kubelet, enter
        finally:
            kubelet.stop()


@contextlib.contextmanager
def hosts_namespace(hosts_file: Path) -> Iterator[list[str]]:
    """A private mount namespace whose /etc/hosts is `hosts_file`; yields the command
    prefix (`nsenter ...`) that runs a command inside it. Needs root (CAP_SYS_ADMIN)."""
    hosts_file.touch()
    holder = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount --bind {shlex.quote(str(hosts_file))} /etc/hosts "
            "&& echo up && exec sleep infinity",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert holder.stdout is not None
    line = holder.stdout.readline()
    if line.strip() != b"up":
        holder.kill()
        _, err = holder.communicate(timeout=5)
        raise RuntimeError(f"cannot make a mount namespace for /etc/hosts: {err.decode().strip()}")
    try:
        yield ["nsenter", f"--mount=/proc/{holder.pid}/ns/mnt", "--"]
    finally:
        holder.kill()
        holder.communicate(timeout=10)  # reaps it and closes its pipes
