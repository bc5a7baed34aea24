"""The cluster the e2e story runs on, as a user reaches it: kubectl with `$KUBECONFIG` for
every change, and the Kubernetes Python client for what kubectl 1.20 offers no command for
(evictions) and for the story's reads. The story reads the cluster thousands of times while
it waits, and a kubectl process costs 0.15-0.2 s of CPU each (its discovery cache read and
its start, measured on a loaded 2-core machine): about a fifth of a core, taken from what it
waits on. A read takes kubectl's names for kinds (`pod`, `bg`, `topics.capstan.io`), looked
up in the API server's discovery as kubectl does."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from tests.kube.node import kubectl_binary

T = TypeVar("T")


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self._kinds: dict[str, tuple[str, str, bool]] = {}

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
        """The object as `kubectl get KIND NAME -o json` shows it; None when it is not there
        or the API server did not answer (as the story's waits want: they look again)."""
        try:
            return self._read(self._path(kind, namespace) + f"/{name}")
        except (client.ApiException, urllib3.exceptions.HTTPError, LookupError):
            return None

    def items(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """What `kubectl get KIND -n NAMESPACE [-l SELECTOR] -o json` lists, each item with
        its kind and apiVersion as kubectl adds them."""
        query = [("labelSelector", selector)] if selector else []
        try:
            listed = self._read(self._path(kind, namespace), query)
        except (client.ApiException, urllib3.exceptions.HTTPError, LookupError) as e:
            raise AssertionError(f"listing {kind} in {namespace}: {e}") from None
        item_kind = str(listed.get("kind", "")).removesuffix("List")
        for item in listed.get("items") or ():
            item.setdefault("kind", item_kind)
            item.setdefault("apiVersion", listed.get("apiVersion"))
        return list(listed.get("items") or ())

    def log(self, namespace: str, pod: str) -> str:
        """The pod's log, as `kubectl logs` prints it; "" while it has none to show."""
        try:  # raw: the client would parse a log that happens to be JSON
            reply = self.core.read_namespaced_pod_log(
                pod, namespace, _request_timeout=30, _preload_content=False
            )
            return str(reply.data.decode("utf-8", "replace"))
        except (client.ApiException, urllib3.exceptions.HTTPError):
            return ""

    def _read(self, path: str, query: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        method, url, headers, body, _ = self.api.param_serialize(
            "GET", path, query_params=query or [], auth_settings=["BearerToken"],
            header_params={"Accept": "application/json"},
        )  # fmt: skip
        reply = self.api.call_api(method, url, headers, body, _request_timeout=30)
        data = reply.read()
        if reply.status >= 400:
            raise client.ApiException(status=reply.status, reason=reply.reason, body=data)
        return dict(json.loads(data))

    def _path(self, kind: str, namespace: str) -> str:
        """The API path of `kind`'s objects in `namespace` (cluster-wide kinds ignore it)."""
        found = self._kinds.get(kind.lower())
        if found is None:  # a kind served since the last look (a CRD the chart installed)
            self._kinds = self._discover()
            found = self._kinds.get(kind.lower())
        if found is None:
            raise LookupError(f"the API server serves no kind named {kind!r}")
        group_version, plural, namespaced = found
        root = _api_root(group_version)
        return f"{root}/namespaces/{namespace}/{plural}" if namespaced else f"{root}/{plural}"

    def _discover(self) -> dict[str, tuple[str, str, bool]]:
        """Every name kubectl takes for a kind (plural, singular, kind, short names, each
        also with `.group`) -> (groupVersion, plural, namespaced), the core kinds and each
        group's preferred version before its others, `extensions` last (its old copies of kinds that
        moved, such as NetworkPolicy, are not what kubectl shows)."""
        versions = ["v1"]
        groups = self._read("/apis")["groups"]
        groups.sort(key=lambda g: g["name"] == "extensions")
        for g in groups:  # the preferred version first; kinds only an older one serves after
            preferred = g["preferredVersion"]["groupVersion"]
            versions.append(preferred)
            versions += [v["groupVersion"] for v in g["versions"] if v["groupVersion"] != preferred]
        kinds: dict[str, tuple[str, str, bool]] = {}
        for group_version in versions:
            root = _api_root(group_version)
            group = group_version.rpartition("/")[0]
            for r in self._read(root)["resources"]:
                if "/" in r["name"]:  # a subresource (pods/log, deployments/scale)
                    continue
                found = (group_version, r["name"], bool(r["namespaced"]))
                names = {r["name"], r.get("singularName") or "", r["kind"].lower()}
                names.update(r.get("shortNames") or ())
                for n in filter(None, names):
                    kinds.setdefault(n, found)
                    if group:
                        kinds.setdefault(f"{n}.{group}", found)
        return kinds

    def node_address(self) -> str:
        """The first node's InternalIP: where NodePort Services answer."""
        for node in self.items("nodes", ""):
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


def _api_root(group_version: str) -> str:
    """Where a group version's kinds are served: the core group under /api, others /apis."""
    return "/api/v1" if group_version == "v1" else f"/apis/{group_version}"


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
