"""A broker's or controller's channel to a peer that was down (a controller, a master, a
replica) reaches it within about a second of it listening again, however long it was down:
gRPC's reconnect backoff is capped at RECONNECT_BACKOFF_MS (it was 2 s, which left brokers
late to controllers that started again after a power loss)."""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent import futures

import grpc

from capstan.common.channel_pool import RECONNECT_BACKOFF_MS, ChannelPool

PROBE = "/capstan.test.Nothing/Here"
BACK_WITHIN_S = 1.6
"""A 1-s cap, gRPC's jitter on it (20 %) and a connect."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _reaches(channel: grpc.aio.Channel) -> bool:
    """Whether a call gets to a server (which has no such method)."""
    call = channel.unary_unary(PROBE, request_serializer=None, response_deserializer=None)
    try:
        await call(b"", timeout=0.5)
    except grpc.aio.AioRpcError as exc:
        return exc.code() is grpc.StatusCode.UNIMPLEMENTED
    return True


def test_a_peer_channel_reaches_a_peer_back_within_its_backoff_cap() -> None:
    port = _free_port()

    async def scenario() -> float:
        pool = ChannelPool()
        channel = pool.get(f"127.0.0.1:{port}")
        try:
            down_until = time.monotonic() + 5  # long enough for the old cap's growth
            while time.monotonic() < down_until:
                assert not await _reaches(channel)
                await asyncio.sleep(0.2)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            server.add_insecure_port(f"127.0.0.1:{port}")
            server.start()
            back_at = time.monotonic()
            try:
                while not await _reaches(channel):
                    assert time.monotonic() - back_at < 10, "the channel never reconnected"
                    await asyncio.sleep(0.05)
                return time.monotonic() - back_at
            finally:
                server.stop(None)
        finally:
            await pool.close()

    took = asyncio.run(scenario())
    assert RECONNECT_BACKOFF_MS <= 1000
    assert took < BACK_WITHIN_S, f"reached it {took:.2f} s after"
