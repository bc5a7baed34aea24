"""The probe that keeps a down replica in routes while its address refuses connections (a
process gone from a host that answers), and leaves out one that accepts them (stopped or
hung: its connections would hold a client's calls)."""

from __future__ import annotations

import asyncio
import socket

from capstan.broker.replication.down_replicas import DownReplicas, refuses


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_closed_port_refuses_and_a_listening_one_does_not():
    async def scenario() -> None:
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen()  # nobody accepts: a stopped process's socket looks the same
        try:
            here = f"127.0.0.1:{listening.getsockname()[1]}"
            gone = f"127.0.0.1:{_closed_port()}"
            assert await refuses(gone)
            assert not await refuses(here)
            probes = DownReplicas(lambda: [gone, here])
            await probes.probe()
            assert probes.silent == {here}
        finally:
            listening.close()

    asyncio.run(scenario())
