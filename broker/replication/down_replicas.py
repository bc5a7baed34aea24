"""Which of the group's down replicas refuse connections: a process gone from a host that
answers, as opposed to one that is stopped, hung or cut off.

Routes name the replicas the controller counts alive (Broker.group_addresses), because a
replica that is stopped or cut off keeps its connections open and answers nothing: a client
whose channel sat on it would wait out every call. A replica whose address refuses
connections is another matter: a client's channel skips it at no cost, and it is usually
back at the same address within seconds (a restart, a crashed container). Routes keep
naming it, so a client whose route was taken while it was down (the official clients
refresh theirs every 30 s) still reaches it when it is back and the replica its route did
name fails next. Each down replica is probed with a TCP connect every second; one that just
went down stays named until its probe says otherwise, so routes do not flicker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

PROBE_EVERY_S = 1.0
CONNECT_TIMEOUT_S = 0.5
"""A connect that neither succeeds nor is refused by then counts as not refused."""


class DownReplicas:
    def __init__(self, down: Callable[[], list[str]]) -> None:
        """`down()`: the host:port of the group's replicas the controller counts down."""
        self._down = down
        self.silent: frozenset[str] = frozenset()
        """The down replicas whose address did not refuse the last probe (it accepted a
        connection nobody serves, or did not answer): routes leave them out. A replica
        that just went down is not among them until probed, so routes do not drop it
        for the moment until the probe finds it refusing."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="down-replica-probes")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self.probe()
            await asyncio.sleep(PROBE_EVERY_S)

    async def probe(self) -> None:
        """Probe every down replica once and keep those that did not refuse."""
        addresses = self._down()
        refused = await asyncio.gather(*(refuses(a) for a in addresses))
        now = frozenset(a for a, r in zip(addresses, refused, strict=True) if not r)
        if now != self.silent:
            log.info("down replicas that do not refuse connections: %s", sorted(now))
        self.silent = now


async def refuses(address: str) -> bool:
    """Whether a TCP connect to host:port is refused (nothing listens there)."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except ConnectionRefusedError:
        return True
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False
