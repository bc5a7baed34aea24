"""The probe that decides which down replicas routes leave out: one whose address refuses
connections (a process gone from a host that answers) stays named, one that does not
answer (a host gone) is left out at once, and one that accepts connections without serving
them (a stopped or hung process) only once it has done so for a while."""

from __future__ import annotations

import asyncio
import socket

from capstan.broker.replication.down_replicas import (
    ACCEPTED,
    NO_ANSWER,
    REFUSED,
    DownReplicas,
    answer_of,
)
from tests.common.test_moved_peer import _black_hole

HUNG_S = 30.0


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_each_kind_of_down_replica_is_told_apart_and_a_hung_one_left_out_only_late():
    async def scenario() -> None:
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen()  # nobody accepts: a stopped process's socket looks the same
        dark_port = _closed_port()
        dark = _black_hole("127.0.0.1", dark_port)
        try:
            hung = f"127.0.0.1:{listening.getsockname()[1]}"
            gone = f"127.0.0.1:{_closed_port()}"
            cut_off = f"127.0.0.1:{dark_port}"
            assert await answer_of(gone) == REFUSED
            assert await answer_of(hung) == ACCEPTED
            assert await answer_of(cut_off) == NO_ANSWER
            clock = [100.0]
            down = [gone, hung, cut_off]
            probes = DownReplicas(lambda: down, HUNG_S, clock=lambda: clock[0])
            await probes.probe()
            assert probes.silent == {cut_off}  # a stop of seconds keeps the hung one named
            clock[0] += HUNG_S - 1
            await probes.probe()
            assert probes.silent == {cut_off}
            clock[0] += 1
            await probes.probe()
            assert probes.silent == {cut_off, hung}
            down = [gone, cut_off]  # the hung one is alive again: its time starts afresh
            await probes.probe()
            down = [gone, hung, cut_off]
            await probes.probe()
            assert probes.silent == {cut_off}
        finally:
            listening.close()
            for s in dark:
                s.close()

    asyncio.run(scenario())


def test_without_a_hold_a_hung_replica_is_left_out_at_once_and_a_refusing_one_never():
    async def scenario() -> None:
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        try:
            hung = f"127.0.0.1:{listening.getsockname()[1]}"
            gone = f"127.0.0.1:{_closed_port()}"
            probes = DownReplicas(lambda: [gone, hung], 0.0)
            await probes.probe()
            assert probes.silent == {hung}
        finally:
            listening.close()

    asyncio.run(scenario())
