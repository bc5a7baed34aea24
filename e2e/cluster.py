"""The cluster the e2e story runs on, as a user reaches it: kubectl with `$KUBECONFIG`, and
the Kubernetes Python client for what kubectl 1.20 offers no command for (evictions)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from tests.kube.node import kubectl_binary

T = TypeVar("T")


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> str:
        done = subprocess.run(
            [kubectl_binary(), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def apply(self, namespace: str, *items: dict[str, Any]) -> str:
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(items)})
        return self.kubectl("apply", "-n", namespace, "-f", "-", stdin=manifest)

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        out = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
        return json.loads(out) if out.strip() else None

    def items(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-n", namespace, "-o", "json"]
        if selector:
            args += ["-l", selector]
        return list(json.loads(self.kubectl(*args))["items"])

    def node_address(self) -> str:
        """The first node's InternalIP: where NodePort Services answer."""
        for node in json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]:
            for address in node["status"]["addresses"]:
                if address["type"] == "InternalIP":
                    return str(address["address"])
        raise AssertionError("no node has an InternalIP")

    def evict(self, namespace: str, pod: str) -> int:
        """Ask the Eviction API to evict `pod`; the HTTP status (201 taken, 429 refused by a
        PodDisruptionBudget or the operator's webhook)."""
        return self.eviction(namespace, pod)[0]

    def eviction(self, namespace: str, pod: str) -> tuple[int, str]:
        """Ask the Eviction API to evict `pod`: (the HTTP status, the refusal's message)."""
        body = {
            "apiVersion": "policy/v1beta1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        try:
            self.core.create_namespaced_pod_eviction(pod, namespace, body)
        except client.ApiException as e:
            try:
                message = str(json.loads(e.body or "{}").get("message", ""))
            except ValueError:
                message = str(e.body)
            return int(e.status), message
        return 201, ""


def wait_for(what: str, check: Callable[[], T | None], timeout_s: float, poll_s: float = 1) -> T:
    """Poll `check` until it returns something truthy, else fail naming `what`. For a wait
    whose `timeout_s` is a promise (a bound of e2e/bounds.py, a failover's 60 s); a wait on
    work whose length follows the machine's speed is `wait_progressing`."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(poll_s)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s (last seen: {last!r})")


STALL_S = 180.0
"""How long a wait on the cluster's work may see nothing change before it fails: longer
than any single step of that work (a pod's start, a broker catching up, a Spark stage) on a
machine half as fast as the development machine."""


def wait_progressing(
    what: str,
    check: Callable[[], T | None],
    progress: Callable[[], object],
    stall_s: float = STALL_S,
    poll_s: float = 1,
) -> T:
    """Poll `check` until it returns something truthy, for as long as the work goes on:
    no deadline, but a failure naming `what` once `progress()` (a snapshot of what the wait
    depends on: pods' states, the group's status, lines read) has stayed the same for
    `stall_s`. A slow machine waits longer; a stuck one fails as soon, saying where."""
    began = changed_at = time.monotonic()
    snapshot = progress()
    while True:
        last = check()
        if last:
            return last
        now = progress()
        if now != snapshot:
            snapshot, changed_at = now, time.monotonic()
        elif time.monotonic() - changed_at > stall_s:
            raise AssertionError(
                f"{what}: nothing progressed for {stall_s:.0f} s, {time.monotonic() - began:.0f}"
                f" s into the wait (stuck at: {snapshot!r}; last seen: {last!r})"
            )
        time.sleep(poll_s)


def wait_process(
    what: str,
    proc: subprocess.Popen[bytes],
    progress: Callable[[], object],
    stall_s: float = STALL_S,
    poll_s: float = 1,
) -> int:
    """`proc`'s exit code once it ends, however long it takes while `progress()` (its
    output, say) keeps changing; killed, and the wait failed, after `stall_s` without."""
    try:
        wait_progressing(what, lambda: proc.poll() is not None, progress, stall_s, poll_s)
        return proc.returncode
    except AssertionError:
        proc.kill()
        proc.wait(timeout=10)
        raise
