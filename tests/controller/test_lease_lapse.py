"""A leading controller whose lease renewal hangs (a slow API server, a stalled disk) stops
acting as leader when its lease ends as it knows it, not when the renewal returns: by then
another replica may have taken the lapsed lease. A real controller server in-process over a
file state store whose renewals can be held."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from capstan.controller.server import ControllerServer
from capstan.controller.settings import ControllerSettings, StateSettings
from capstan.controller.state_store import FileStateStore
from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc

LEASE_S = 1.5


class HeldRenewals(FileStateStore):
    """try_lead waits while `held` is set (until released)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.held = threading.Event()
        self.released = threading.Event()

    def try_lead(self, holder: str, duration_s: float) -> bool:
        if self.held.is_set():
            self.released.wait(30)
        return super().try_lead(holder, duration_s)


async def _until(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.05)


async def _register(port: int) -> grpc.StatusCode:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.ControllerStub(channel)  # type: ignore[no-untyped-call]
        request = pb.RegisterBrokerRequest(group="g", address="127.0.0.1:1", identity="a")
        try:
            await stub.RegisterBroker(request, timeout=5)
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.mark.asyncio
async def test_a_leader_whose_renewal_hangs_stops_leading_when_its_lease_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="capstan.controller.server")
    state = tmp_path / "state"
    store = HeldRenewals(state)
    settings = ControllerSettings(
        listen_host="127.0.0.1",
        grpc_port=0,
        http_port=-1,
        lease_duration_s=LEASE_S,
        state=StateSettings(backend="file", directory=str(state)),
    )
    server = ControllerServer(settings, store)
    await server.start()
    try:
        await _until("the controller to lead", server.is_leader, 10)
        assert await _register(server.grpc_port) == grpc.StatusCode.OK
        store.held.set()  # the next renewal hangs
        held_at = time.monotonic()
        await _until("the lead to end with the lease", lambda: not server.is_leader(), 5)
        assert time.monotonic() - held_at <= LEASE_S + 0.2
        assert await _register(server.grpc_port) == grpc.StatusCode.FAILED_PRECONDITION
        store.held.clear()
        store.released.set()
        await _until("the controller to lead again", server.is_leader, 10)
        assert "renewed its lease after it lapsed" in caplog.text
        assert await _register(server.grpc_port) == grpc.StatusCode.OK
    finally:
        store.released.set()
        await server.stop()
