"""A real Kubernetes control plane for tests: etcd, kube-apiserver and
kube-controller-manager 1.20.2 (built by scripts/k8s_tools.sh) on free 127.0.0.1 ports.

The StatefulSet, garbage-collector and disruption controllers run for real; there is no
scheduler or kubelet, so no pod ever runs: tests that need running pods use the real node
(tests/kube/node.py). Clients authenticate with a static token of the system:masters group
and verify the API server's self-signed certificate.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client, config

from tests.broker.broker_process import free_port
from tests.kube.node import binaries, kubectl_binary
from tests.kube.processes import spawn, spawn_etcd, stop_all
from tests.tiers import process_tool

TOKEN = "capstan-test-admin-token"
_START_S = 60.0


@process_tool
@dataclass
class ControlPlane:
    root: Path
    port: int = 0
    kubeconfig: Path = field(init=False)
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kubeconfig = self.root / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def api(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this plane; the caller checks returncode."""
        return subprocess.run(
            [kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def start(self) -> ControlPlane:
        bin_dir = binaries()
        missing = [
            n for n in ("kube-apiserver", "kube-controller-manager") if not (bin_dir / n).exists()
        ]
        if missing or shutil.which("etcd") is None:
            raise RuntimeError(
                f"the Kubernetes control plane is not built ({', '.join(missing) or 'etcd'} "
                "missing): run `bash scripts/k8s_tools.sh`"
            )
        r = self.root
        (r / "certs").mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["openssl", "genrsa", "-out", str(r / "sa.key"), "2048"],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(r / "sa.key"), "-pubout", "-out", str(r / "sa.pub")],
            check=True,
            capture_output=True,
        )
        (r / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
        etcd, etcd_url = spawn_etcd(r)
        self._procs.append(etcd)
        self.port = free_port()
        self._spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={r / 'certs'}",
                f"--token-auth-file={r / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={r / 'sa.pub'}",
                f"--service-account-signing-key-file={r / 'sa.key'}",
                "--service-cluster-ip-range=198.18.240.0/24",
                # Webhooks named by a Service are called at one of its endpoints rather than
                # at its cluster IP, which nothing routes here.
                "--enable-aggregator-routing=true",
            ],
        )
        self._wait_ready()
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters: [{{name: test, cluster: {{server: '{self.server}', "
            f"certificate-authority: '{r / 'certs' / 'apiserver.crt'}'}}}}]\n"
            f"users: [{{name: admin, user: {{token: {TOKEN}}}}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: admin}}]\n"
            "current-context: test\n"
        )
        self._spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--port=0",
                f"--service-account-private-key-file={r / 'sa.key'}",
                f"--root-ca-file={r / 'certs' / 'apiserver.crt'}",
                "--use-service-account-credentials=false",
            ],
        )
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._procs.append(spawn(self.root, name, argv))

    def _wait_ready(self) -> None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the cert is not written until it serves
        request = urllib.request.Request(
            f"{self.server}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        deadline = time.monotonic() + _START_S
        while time.monotonic() < deadline:
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited: {self._log_tail()}")
            try:
                with urllib.request.urlopen(request, timeout=2, context=context) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready within {_START_S:.0f} s: {self._log_tail()}")

    def _log_tail(self) -> str:
        path = self.root / "kube-apiserver.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return " | ".join(lines[-5:])

    def stop(self) -> None:
        stop_all(self._procs)
        self._procs.clear()
