"""The processes a test's Kubernetes parts run as (etcd, API servers, controllers): each in
a session of its own with its output in `<root>/<name>.log`, and stopped together."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests.broker.broker_process import free_port


def spawn(root: Path, name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session (so its children stop with it), logging to
    `root/name.log`."""
    with (root / f"{name}.log").open("ab") as log:
        return subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def spawn_etcd(root: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A one-member etcd with its data in `root/etcd`, on free loopback ports; (the process,
    its client URL)."""
    client_url = f"http://127.0.0.1:{free_port()}"
    peer_url = f"http://127.0.0.1:{free_port()}"
    proc = spawn(
        root,
        "etcd",
        [
            "etcd",
            f"--data-dir={root / 'etcd'}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=default={peer_url}",
        ],
    )
    return proc, client_url


def stop_all(started: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process's session, the last started first; SIGKILL what has not ended
    within 15 s."""
    last_first = list(reversed(started))
    for proc in last_first:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in last_first:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
