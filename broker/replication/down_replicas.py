"""How each of the group's down replicas answers a connection, for the routes.

Routes name the replicas the controller counts alive (Broker.group_addresses); of the down
ones, what a TCP connect to each finds decides (probed every second):

- refused (nothing listens: a process gone from a host that answers, usually back at the
  same address within seconds): named, since a client's channel skips it at no cost, and a
  client whose route was taken while it was down (the official clients refresh theirs every
  30 s, and sort the addresses) still reaches it when it is back and the replica its route
  did name fails next;
- no answer (a host gone or cut off): left out at once, since a client's channel on it
  would wait out every call until its route leaves it out;
- accepted but not served (a stopped or hung process on a live host, which may resume):
  left out once it has been so for `hung_s` (`replication.hung_replica_routed_ms`, 0 by
  default: at once). A client's channel on it waits until it resumes or the client's route
  changes, which leaving it out brings about at the client's next refresh. A hold keeps
  it in the routes taken during a short stop instead: a route without it gives the
  client's new channel the other replicas only, until its next refresh, and a kill of
  those meanwhile failed every send for up to 30 s.

A replica that just went down stays named until its probe says otherwise, so routes do not
flicker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PROBE_EVERY_S = 1.0
CONNECT_TIMEOUT_S = 0.5
"""A connect that neither succeeds nor is refused by then gets no answer."""

REFUSED, ACCEPTED, NO_ANSWER = "refused", "accepted", "no answer"


class DownReplicas:
    def __init__(
        self,
        down: Callable[[], list[str]],
        hung_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`down()`: the host:port of the group's replicas the controller counts down;
        `hung_s`: how long one may accept connections without serving and stay named."""
        self._down = down
        self._hung_s = hung_s
        self._clock = clock
        self.silent: frozenset[str] = frozenset()
        """The down replicas routes leave out: those whose address did not answer the last
        probe, and those that have accepted connections without serving them for
        `hung_s`. A replica that just went down is not among them until probed."""
        self._accepting_since: dict[str, float] = {}
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
        """Probe every down replica once and decide which routes leave out."""
        addresses = self._down()
        answers = await asyncio.gather(*(answer_of(a) for a in addresses))
        now = self._clock()
        accepting: dict[str, float] = {}
        left_out: set[str] = set()
        for address, answer in zip(addresses, answers, strict=True):
            if answer == ACCEPTED:
                since = accepting[address] = self._accepting_since.get(address, now)
                if now - since >= self._hung_s:
                    left_out.add(address)
            elif answer == NO_ANSWER:
                left_out.add(address)
        self._accepting_since = accepting
        if left_out != self.silent:
            log.info("down replicas left out of routes: %s", sorted(left_out))
        self.silent = frozenset(left_out)


async def answer_of(address: str) -> str:
    """What a TCP connect to host:port finds: REFUSED (nothing listens), ACCEPTED (a
    listening socket, served or not), or NO_ANSWER within CONNECT_TIMEOUT_S."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except ConnectionRefusedError:
        return REFUSED
    except (OSError, TimeoutError, ValueError):
        return NO_ANSWER
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return ACCEPTED
