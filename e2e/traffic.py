"""The story's clients and their history: official-client producers and consumers outside
the cluster (processes here, through a NodePort) and inside it (pods of Capstan's image
through the group's Service), every send and receipt written down, and the figures taken
from it: acknowledged, failed, lost, duplicated, the longest gap between acknowledged sends.

The cluster is secured (the operator's default): a client trusts the namespace's CA bundle
(ConfigMap capstan-ca-bundle) and signs with a user's keys (Secret capstan-admin, or a
CapstanUser's), given by environment variables (clients/traffic.py reads them).
"""

from __future__ import annotations

import base64
import itertools
import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.cluster import Kube

CLIENTS = Path(__file__).with_name("clients")
CLIENT = CLIENTS / "traffic.py"


@dataclass(frozen=True)
class Volume:
    """How much the story sends, a setting of the story: each main producer sends `rate`
    messages a second from step c to step z (the load balancer's producer a quarter of
    that), and one body in `sample_every` is in the sample the official client reads back
    in step z (Capstan's SDK reads back everything). The default, 5 a second and one in 4,
    sends about 20,000 messages over a 25-minute story, half what the story sent before it
    had a setting, and samples about 5,000: the official Python client reads 25-50 a second
    on a loaded 2-core machine, so its read-back takes 2-4 minutes even on a machine half as
    fast. `E2E_SEND_RATE` and `E2E_SAMPLE_EVERY` change them."""

    rate: float = 5.0
    sample_every: int = 4

    @classmethod
    def from_env(cls) -> Volume:
        rate = float(os.environ.get("E2E_SEND_RATE") or cls.rate)
        every = int(os.environ.get("E2E_SAMPLE_EVERY") or cls.sample_every)
        if rate <= 0 or every < 1:
            raise ValueError(f"E2E_SEND_RATE {rate} must be > 0, E2E_SAMPLE_EVERY {every} >= 1")
        return cls(rate, every)

    def producing(self, share: float = 1.0) -> list[str]:
        """traffic.py produce's arguments for a producer sending `share` of the rate."""
        return ["--rate", f"{self.rate * share:g}", "--sample-every", str(self.sample_every)]


def produced_topic(args: list[str]) -> str | None:
    """The topic a traffic.py command line sends to (None for a consumer)."""
    return args[2] if args and args[0] == "produce" else None


def acknowledged_sends(output: str) -> int:
    """How many sends a producer's output acknowledges (its `S` lines, a 1 in the third
    column)."""
    return sum(
        1 for line in output.splitlines() if line.startswith("S\t") and line.split("\t")[2] == "1"
    )


@dataclass
class Send:
    at: float
    ok: bool
    body: str
    error: str


@dataclass
class History:
    sends: dict[str, list[Send]] = field(default_factory=dict)
    """Per producer name."""
    received: list[tuple[float, str, str]] = field(default_factory=list)
    """(clock, topic, body) of every receipt by the running consumers."""
    topics: dict[str, str] = field(default_factory=dict)
    """The topic each producer sent to, where it was told."""

    def add_lines(self, source: str, text: str, topic: str | None = None) -> None:
        if topic is not None:
            self.topics[source] = topic
        for line in text.splitlines():
            fields = line.split("\t")
            if fields[0] == "S" and len(fields) == 5:
                self.sends.setdefault(source, []).append(
                    Send(float(fields[1]), fields[2] == "1", fields[3], fields[4])
                )
            elif fields[0] == "R" and len(fields) == 4:
                self.received.append((float(fields[1]), fields[2], fields[3]))

    def acknowledged(self, topic: str | None = None, sources: set[str] | None = None) -> set[str]:
        """The bodies acknowledged (to `topic`'s producers, if given; of `sources`, if given)."""
        return {
            s.body
            for source, sends in self.sends.items()
            if (topic is None or self.topics.get(source) == topic)
            and (sources is None or source in sources)
            for s in sends
            if s.ok
        }

    def failed(self, outside: list[tuple[float, float]] | None = None) -> int:
        """How many sends failed (only those outside every [start, end] window of `outside`,
        if given)."""
        windows = outside or []
        return sum(
            1
            for sends in self.sends.values()
            for s in sends
            if not s.ok and not any(start <= s.at <= end for start, end in windows)
        )

    def longest_gap(self, since: float = 0.0, until: float = float("inf")) -> float:
        """The longest time, in seconds, one producer went without an acknowledged send in
        [since, until]: between two, and from a given edge of the window to the nearest one
        (a gap that began before a fault's window, or lasts past its end, counts in full
        within it; a producer with none in the window was without for all of it)."""
        longest = 0.0
        for sends in self.sends.values():
            times = [s.at for s in sends if s.ok and since <= s.at <= until]
            if since > 0:
                times.insert(0, since)
            if until != float("inf"):
                times.append(until)
            longest = max([longest, *(b - a for a, b in itertools.pairwise(times))])
        return longest

    def acked_between(self, since: float, until: float) -> int:
        return sum(
            1 for sends in self.sends.values() for s in sends if s.ok and since <= s.at <= until
        )


def read_back_figures(acked: set[str], bodies: list[str]) -> dict[str, int]:
    """What a read-back of `acked` that received `bodies` shows: how many of them came
    back, lost (never), and duplicated (the extra copies of any body that came more than
    once, acknowledged or not: a send whose answer was lost may still have been stored)."""
    counts = Counter(bodies)
    return {
        "acknowledged": len(acked),
        "read_back": len(acked & set(counts)),
        "lost": len(acked - set(counts)),
        "duplicated": sum(n - 1 for n in counts.values() if n > 1),
    }


def received_bodies(lines: str) -> list[str]:
    """The bodies of a reader's `R` lines, in order."""
    history = History()
    history.add_lines("reader", lines)
    return [body for _, _, body in history.received]


ADMIN_KEYS = "capstan-admin"
CA_BUNDLE = "capstan-ca-bundle"
CA_MOUNT = "/etc/capstan-ca"


def access_env(kube: Kube, namespace: str, work: Path, keys: str = ADMIN_KEYS) -> dict[str, str]:
    """The environment of a client here reaching `namespace`'s secured cluster: its CA
    bundle (written under `work`) and the keys in the Secret `keys`."""
    bundle = kube.get("configmap", CA_BUNDLE, namespace)
    secret = kube.get("secret", keys, namespace)
    assert bundle is not None and secret is not None, f"{namespace} has no CA bundle or keys"
    ca = work / f"ca-{namespace}.crt"
    ca.write_text(bundle["data"]["ca.crt"])
    data = secret["data"]
    return {
        "CAPSTAN_CA": str(ca),
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(ca),  # the official client's TLS trusts it
        "CAPSTAN_ACCESS_KEY": base64.b64decode(data["access-key"]).decode(),
        "CAPSTAN_SECRET_KEY": base64.b64decode(data["secret-key"]).decode(),
    }


class OutsideClient:
    """A client process on this machine, outside the cluster; `env` its access."""

    def __init__(self, work: Path, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.topic = produced_topic(args)
        self.samples = "--sample-every" in args
        """Whether it tags a sample for the official client's read-back."""
        self.out = work / f"{name}.tsv"
        self.stop_file = work / f"{name}.stop"
        self.log = work / f"{name}.log"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-P",
                    str(CLIENT),
                    *args,
                    "--out",
                    str(self.out),
                    "--stop",
                    str(self.stop_file),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
            )

    def lines(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def stop(self, timeout_s: float = 60) -> None:
        self.stop_file.touch()
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


class InsideClient:
    """A client pod of Capstan's image, running a script of clients/ (traffic.py unless
    told) from a ConfigMap; its lines are its log. It trusts the namespace's CA bundle and
    signs with the keys in the Secret `keys`."""

    CONFIG_MAP = "e2e-traffic"

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        image: str,
        name: str,
        args: list[str],
        script: str = CLIENT.name,
        keys: str = ADMIN_KEYS,
    ):
        self.kube, self.namespace, self.name = kube, namespace, name
        self.topic = produced_topic(args) if script == CLIENT.name else None
        self.samples = "--sample-every" in args
        kube.apply(namespace, _pod(name, image, [f"/e2e/{script}", *args], keys))

    @classmethod
    def install(cls, kube: Kube, namespace: str) -> None:
        kube.apply(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": cls.CONFIG_MAP},
                "data": {p.name: p.read_text() for p in sorted(CLIENTS.glob("*.py"))},
            },
        )

    def lines(self) -> str:
        return self.kube.log(self.namespace, self.name)

    def running(self) -> bool:
        return self.phase() == "Running"

    def phase(self) -> str:
        pod = self.kube.get("pod", self.name, self.namespace)
        return str(pod["status"].get("phase", "")) if pod else ""

    def exit_code(self) -> int | None:
        """The client's exit code once its container has ended, else None."""
        pod = self.kube.get("pod", self.name, self.namespace) or {}
        for container in (pod.get("status") or {}).get("containerStatuses") or ():
            ended = (container.get("state") or {}).get("terminated")
            if ended is not None:
                return int(ended["exitCode"])
        return None

    def stop(self) -> str:
        """Ends the client with SIGTERM (its pod's deletion) and returns its lines, read
        just before."""
        self.kube.kubectl(
            "exec", "-n", self.namespace, self.name, "--", "sh", "-c", "kill -TERM 1", check=False
        )
        self.kube.kubectl(
            "wait",
            "-n",
            self.namespace,
            f"pod/{self.name}",
            "--for=condition=Ready=false",
            "--timeout=60s",
            check=False,
        )
        lines = self.lines()
        self.kube.kubectl(
            "delete", "pod", "-n", self.namespace, self.name, "--wait=false", check=False
        )
        return lines


def _from_keys(env: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def _pod(name: str, image: str, args: list[str], keys: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "e2e-traffic"}},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001},
            "containers": [
                {
                    "name": "client",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-P", *args],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                    "securityContext": {
                        "readOnlyRootFilesystem": True,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "env": [
                        {"name": "CAPSTAN_CA", "value": f"{CA_MOUNT}/ca.crt"},
                        {"name": "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "value": f"{CA_MOUNT}/ca.crt"},
                        _from_keys("CAPSTAN_ACCESS_KEY", keys, "access-key"),
                        _from_keys("CAPSTAN_SECRET_KEY", keys, "secret-key"),
                    ],
                    "volumeMounts": [
                        {"name": "script", "mountPath": "/e2e"},
                        {"name": "tmp", "mountPath": "/tmp"},
                        {"name": "ca", "mountPath": CA_MOUNT, "readOnly": True},
                    ],
                }
            ],
            "volumes": [
                {"name": "script", "configMap": {"name": InsideClient.CONFIG_MAP}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "ca", "configMap": {"name": CA_BUNDLE}},
            ],
        },
    }
