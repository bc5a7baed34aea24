"""The operators' HTTP endpoints: a scrape reads state where it changes, and a failing
collector gets a clear 500 instead of a dropped connection."""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from capstan.common.http_endpoints import HttpEndpoints
from capstan.common.security_settings import TlsSettings
from capstan.security.local_ca import create_ca
from capstan.security.tls import https_context


class _GrowingDict(Collector):
    """Reads a dict that the event loop keeps growing, as the broker's gauges do."""

    def __init__(self, state: dict[int, int]) -> None:
        self._state = state

    def collect(self) -> Iterable[GaugeMetricFamily]:
        total = 0
        for key, value in self._state.items():
            total += value
            if key % 500 == 0:
                threading.Event().wait(0.0005)  # lets other threads run mid-walk
        yield GaugeMetricFamily("grown_total", "sum of the dict", value=total)


class _Failing(Collector):
    def collect(self) -> Iterable[GaugeMetricFamily]:
        raise ValueError("the gauge's source is gone")


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=15) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture
def running_loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


def test_scrapes_while_the_loop_changes_the_state_all_succeed(running_loop) -> None:
    state: dict[int, int] = dict.fromkeys(range(5000), 1)
    registry = CollectorRegistry()
    registry.register(_GrowingDict(state))
    endpoints = HttpEndpoints("127.0.0.1", 0, registry, lambda: True, lambda: True, running_loop)
    endpoints.start()
    stop = False

    async def grow() -> None:  # adds and takes away keys: the size changes, the total not
        n = len(state)
        while not stop:
            for _ in range(200):
                state[n] = 1
                del state[n - 5000]
                n += 1
            await asyncio.sleep(0.001)

    growing = asyncio.run_coroutine_threadsafe(grow(), running_loop)
    try:
        replies = [_get(endpoints.port, "/metrics") for _ in range(8)]
    finally:
        stop = True
        growing.result(10)
        endpoints.stop()
    assert [code for code, _ in replies] == [200] * 8
    assert all("grown_total 5000.0" in text for _, text in replies)


def test_a_failing_collector_answers_500_with_the_reason() -> None:
    registry = CollectorRegistry()
    registry.register(_Failing())
    endpoints = HttpEndpoints("127.0.0.1", 0, registry, lambda: True, lambda: False)
    endpoints.start()
    try:
        code, text = _get(endpoints.port, "/metrics")
        ready_code, _ = _get(endpoints.port, "/readyz")
        health_code, _ = _get(endpoints.port, "/healthz")
    finally:
        endpoints.stop()
    assert code == 500
    assert "the gauge's source is gone" in text
    assert (ready_code, health_code) == (503, 200)


def _get_https(port: int, ca: Path) -> tuple[int, str]:
    """The status and the one sample of the scrape (its comment lines left out)."""
    context = ssl.create_default_context(cafile=str(ca))
    url = f"https://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=15, context=context) as reply:
        samples = [line for line in reply.read().decode().splitlines() if line[:1] != "#"]
        return reply.status, "\n".join(samples)


GROWN = "grown_total 7.0"


def test_https_endpoints_refuse_plain_http_and_take_up_a_rotated_certificate(
    tmp_path: Path,
) -> None:
    """With tls.metrics a scrape must come over TLS and trust the CA; a certificate
    replaced on disk serves the next connection, and the endpoints keep answering."""
    registry = CollectorRegistry()
    registry.register(_GrowingDict({1: 7}))
    first_ca, second_ca = create_ca(tmp_path / "ca1"), create_ca(tmp_path / "ca2")
    served = first_ca.issue(tmp_path / "tls", "metrics", ["127.0.0.1"])
    settings = TlsSettings(
        enabled=True,
        cert_file=str(served.certificate),
        key_file=str(served.key),
        ca_file=str(first_ca.certificate),
        metrics=True,
    )
    tls = https_context(settings)
    assert tls is not None
    endpoints = HttpEndpoints(
        "127.0.0.1", 0, registry, lambda: True, lambda: True, None, tls.current
    )
    endpoints.start()
    try:
        assert _get_https(endpoints.port, first_ca.certificate) == (200, GROWN)
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            _get(endpoints.port, "/metrics")  # plain HTTP on the HTTPS port
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            _get_https(endpoints.port, second_ca.certificate)
        rotated = second_ca.issue(tmp_path / "next", "metrics", ["127.0.0.1"])
        os.replace(rotated.key, served.key)  # the key first: a mismatch keeps the old pair
        os.replace(rotated.certificate, served.certificate)
        assert _get_https(endpoints.port, second_ca.certificate) == (200, GROWN)
        assert tls.reloads >= 1
    finally:
        endpoints.stop()


def test_tls_metrics_needs_tls_itself() -> None:
    with pytest.raises(ValueError, match=r"tls\.metrics needs tls\.enabled"):
        TlsSettings(metrics=True)
    assert https_context(TlsSettings()) is None
