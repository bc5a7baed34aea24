"""A broker whose controller link no longer beats is not left serving unseen: once a round
has lasted past ROUND_STUCK_S, /healthz fails (the kubelet restarts the container) and the
log names where the round waits; a CancelledError from a call, not a cancel of the link,
fails one round and the link beats on. A real controller process, a broker in-process."""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from capstan.broker.broker import Broker
from capstan.broker.replication import controller_link
from capstan.broker.replication.controller_link import ControllerLink
from capstan.broker.replication.replica_group import Role
from capstan.broker.server import BrokerServer
from capstan.common.broker_settings import BrokerSettings, ReplicationSettings
from tests.broker.broker_process import free_port
from tests.controller.controller_process import ControllerProcess


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


async def _until(what: str, check: Callable[[], object], timeout_s: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await asyncio.to_thread(check):
        assert loop.time() < deadline, f"{what}: not within {timeout_s:.0f} s"
        await asyncio.sleep(0.2)


def _settings(tmp_path: Path, controller: ControllerProcess) -> BrokerSettings:
    return BrokerSettings(
        listen_host="127.0.0.1",
        grpc_port=free_port(),
        http_port=free_port(),
        data_dir=str(tmp_path / "broker"),
        broker_name="watched",
        replication=ReplicationSettings(controller_address=controller.address),
    )


def _leads(server: BrokerServer) -> bool:
    """Whether the broker took the master's role the controller gave it."""
    group = server.broker.replication if server.broker is not None else None
    return group is not None and group.role is Role.MASTER


@pytest.mark.asyncio
async def test_a_stuck_round_fails_the_health_check_and_logs_where_it_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger=controller_link.__name__)
    monkeypatch.setattr(controller_link, "ROUND_STUCK_S", 1.0)
    monkeypatch.setattr(controller_link, "ROUND_TELL_S", 0.5)
    released = asyncio.Event()
    lead = Broker.lead

    async def lead_when_released(self: Broker, *args: object) -> None:
        await released.wait()
        await lead(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Broker, "lead", lead_when_released)
    controller = ControllerProcess(tmp_path / "controller", tmp_path / "state").start()
    server = BrokerServer(_settings(tmp_path, controller))
    try:
        await server.start()
        port = server.http_port
        # Named master by the first reply, the broker's role change waits: no more beats.
        await _until("healthz failing", lambda: _health(port) == 503)
        assert "the controller link's round has lasted" in caplog.text
        assert "lead_when_released" in caplog.text  # the stack names where it waits
        assert caplog.text.count("waits at") == 1  # told once, not at every probe
        released.set()
        await _until("healthz passing again", lambda: _health(port) == 200)
        await _until("the broker leading", lambda: _leads(server))
        assert "the controller link's round that was stuck has ended" in caplog.text
    finally:
        await server.stop()
        controller.stop()


@pytest.mark.asyncio
async def test_a_call_cancelled_under_the_link_fails_one_round_and_the_link_beats_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger=controller_link.__name__)
    beat_once = ControllerLink.beat_once
    cancelled = 0

    async def beat_cancelled_once(self: ControllerLink) -> None:
        nonlocal cancelled
        if not cancelled:
            cancelled += 1
            raise asyncio.CancelledError  # as a gRPC call cancelled by its channel raises
        await beat_once(self)

    monkeypatch.setattr(ControllerLink, "beat_once", beat_cancelled_once)
    controller = ControllerProcess(tmp_path / "controller", tmp_path / "state").start()
    server = BrokerServer(_settings(tmp_path, controller))
    try:
        await server.start()
        await _until("the broker leading", lambda: _leads(server))
        assert cancelled == 1
        assert "was cancelled under it" in caplog.text
        assert await asyncio.to_thread(_health, server.http_port) == 200
    finally:
        await server.stop()  # a real cancel still ends the link: the stop returns
        controller.stop()
