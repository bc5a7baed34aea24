"""A real Prometheus Pushgateway (Debian's prometheus-pushgateway, installed by
scripts/chart_tools.sh) on a free port of 127.0.0.1: where the offset audit pushes its
metrics in the tests."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

from tests.broker.broker_process import free_port
from tests.tiers import process_tool
from tests.waiting import wait_until


def http_get(url: str) -> str | None:
    """The body at `url`, or None when nothing answers there."""
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return str(reply.read().decode())
    except OSError:
        return None


@process_tool
@contextlib.contextmanager
def running_pushgateway() -> Iterator[str]:
    """A started Pushgateway; its host:port."""
    binary = shutil.which("prometheus-pushgateway")
    assert binary, "prometheus-pushgateway comes with scripts/chart_tools.sh"
    address = f"127.0.0.1:{free_port()}"
    gateway = subprocess.Popen(
        # Debian's build persists to /var/lib/prometheus by default: keep each in memory.
        [binary, f"--web.listen-address={address}", "--persistence.file="],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: http_get(f"http://{address}/-/ready") is not None, 20, "a Pushgateway")
        yield address
    finally:
        gateway.terminate()
        gateway.wait(10)
