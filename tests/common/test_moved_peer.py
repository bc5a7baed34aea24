"""A peer that moves to a new address under the same name, as a replaced pod does on
Kubernetes, is reached at its new address within seconds by every channel Capstan keeps:
the brokers' pooled channels (capstan/common/channel_pool.py) and the SDK's
(client/channels.py).

The hard case is the one the e2e story met: the old address answers nothing at all (not
even a refusal), and the channel was already trying it when the name moved. Here a small
DNS server on 127.0.0.1 answers for the name (gRPC's `dns://server/name:port` target asks
it), and the old address is a listening socket whose backlog is full, so connection
attempts to it hang as they do to a pod that is gone.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest

from capstan.client.channels import ChannelPool as SdkChannels
from capstan.common.channel_pool import ChannelPool as PeerChannels

NAME = "peer.capstan.test"
OLD, NEW = "127.0.0.2", "127.0.0.3"
METHOD = "/capstan.test.Moved/Hello"
REACHED_WITHIN_S = 3.0


class NameServer:
    """Answers A queries for any name with `address` (and nothing else), on 127.0.0.1."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.settimeout(0.2)
        self.port = self._socket.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                query, peer = self._socket.recvfrom(512)
            except TimeoutError:
                continue
            self._socket.sendto(self._answer(query), peer)

    def _answer(self, query: bytes) -> bytes:
        ident = struct.unpack(">H", query[:2])[0]
        end = 12
        while query[end]:  # the question's name, label by label
            end += query[end] + 1
        question = query[12 : end + 5]
        qtype = struct.unpack(">H", query[end + 1 : end + 3])[0]
        records = b""
        if qtype == 1:  # A: one record, pointing back at the question's name, TTL 0
            records = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 0, 4)
            records += socket.inet_aton(self.address)
        header = struct.pack(">HHHHHH", ident, 0x8180, 1, 1 if records else 0, 0, 0)
        return header + question + records

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()
        self._socket.close()


def _server(host: str, port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    hello = grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"hello from " + host.encode()
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("capstan.test.Moved", {"Hello": hello})]
    )
    server.add_insecure_port(f"{host}:{port}")
    server.start()
    return server


def _black_hole(host: str, port: int) -> list[socket.socket]:
    """A listener at host:port that never accepts, its backlog full: a connection attempt
    to it gets no answer, as one to a pod that is gone. The sockets, to close."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(0)
    held = [listener]
    for _ in range(3):
        filler = socket.socket()
        filler.setblocking(False)
        try:
            filler.connect((host, port))
        except BlockingIOError:
            pass
        held.append(filler)
    return held


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((OLD, 0))
        port = int(s.getsockname()[1])
    with socket.socket() as s:
        s.bind((NEW, port))  # free on both addresses
    return port


class MovingPeer:
    """NAME served at OLD; `go_dark()` turns OLD into a black hole, `move()` then points the
    name at NEW and serves there. `target` is what to dial."""

    def __init__(self) -> None:
        self._names = NameServer(OLD)
        self._port = _free_port()
        self._servers = [_server(OLD, self._port)]
        self._held: list[socket.socket] = []
        self.target = f"dns://127.0.0.1:{self._names.port}/{NAME}:{self._port}"

    def go_dark(self) -> None:
        self._servers[0].stop(0).wait()
        self._held.extend(_black_hole(OLD, self._port))

    def move(self) -> None:
        self._names.address = NEW
        self._servers.append(_server(NEW, self._port))

    def stop(self) -> None:
        for server in self._servers:
            server.stop(0)
        for s in self._held:
            s.close()
        self._names.stop()


@pytest.fixture
def peer() -> Iterator[MovingPeer]:
    moving = MovingPeer()
    try:
        yield moving
    finally:
        moving.stop()


def _goaway_still_on_its_way(error: Any) -> bool:
    """Whether a call failed on the old server's connection because the channel had not
    yet read that server's GOAWAY (a loaded machine): the next call tries the address."""
    return bool(error.code() is grpc.StatusCode.UNAVAILABLE and "GOAWAY" in error.details())


def test_a_brokers_pooled_channel_reaches_a_peer_that_moved_while_it_tried_the_old_address(
    peer: MovingPeer,
):
    target = peer.target

    async def run() -> float:
        pool = PeerChannels()
        try:
            hello = pool.get(target).unary_unary(METHOD)
            assert await hello(b"", timeout=5) == b"hello from " + OLD.encode()
            peer.go_dark()
            # A call passed on while the old address is gone (a forwarder waits for ready):
            # the channel now tries the old address.
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await hello(b"", timeout=1, wait_for_ready=True)
                if not _goaway_still_on_its_way(failed.value):
                    break
            assert failed.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            peer.move()
            began = time.monotonic()
            reply = await pool.get(target).unary_unary(METHOD)(b"", timeout=10, wait_for_ready=True)
            assert reply == b"hello from " + NEW.encode()
            return time.monotonic() - began
        finally:
            await pool.close()

    assert asyncio.run(run()) < REACHED_WITHIN_S


def test_an_sdk_channel_reaches_a_broker_that_moved_while_it_tried_the_old_address(
    peer: MovingPeer,
):
    target = peer.target
    pool = SdkChannels()
    try:
        hello = pool.get(target).unary_unary(METHOD)
        assert hello(b"", timeout=5) == b"hello from " + OLD.encode()
        peer.go_dark()
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as failed:
                hello(b"", timeout=1, wait_for_ready=True)
            if not _goaway_still_on_its_way(failed.value):
                break
        assert failed.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        peer.move()
        began = time.monotonic()
        reply = pool.get(target).unary_unary(METHOD)(b"", timeout=10, wait_for_ready=True)
        assert reply == b"hello from " + NEW.encode()
        assert time.monotonic() - began < REACHED_WITHIN_S
    finally:
        pool.close()
