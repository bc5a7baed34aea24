"""The checks that free a FIFO consumer group held at a moved logic queue's new item
(OrderGate, broker/static_topics.py): has the group finished the earlier item on the group
that holds it?

Every second, while reads wait on a check, this asks that group's master (found through
the controller, as the cluster) for the consumer group's committed offset of the logic
queue and the queue's first offset there, both logic offsets: the item is finished once
either reaches its logic end (the group read it all, or retention removed what it had not).
That master commits its pop consumers' acks every second, so a group moves on to the new
item within about two seconds of its last ack on the old one. An unreachable group keeps
the order held and is asked again; the consumer group sees nothing new of that queue
meanwhile, which is what FIFO order asks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from capstan.broker.group_links import GroupLinks, NoMaster
from capstan.broker.static_topics import OrderCheck, OrderGate

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
WARN_EVERY_S = 60.0
"""A check that keeps failing is logged once a minute."""


class StaticOrderChecks:
    def __init__(
        self,
        gate: OrderGate,
        links: GroupLinks,
        freed: Callable[[str], None],
        serving: Callable[[], bool],
    ) -> None:
        """`links` reach the other groups' masters; `freed(topic)` wakes the receives
        waiting on the topic; checks run only while `serving()` (this broker serves its
        group's consumers)."""
        self._gate = gate
        self._links = links
        self._freed = freed
        self._serving = serving
        self._task: asyncio.Task[None] | None = None
        self._warned_at: dict[OrderCheck, float] = {}

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="static-order-checks")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY_S)
            if self._serving():
                await self.check_all()

    async def check_all(self) -> None:
        """Make every wanted check once; free the receives of those that passed."""
        for check in self._gate.wanted():
            try:
                done = await self._finished(check)
            except (grpc.aio.AioRpcError, NoMaster) as exc:
                now = time.monotonic()
                if now - self._warned_at.get(check, -WARN_EVERY_S) < WARN_EVERY_S:
                    continue
                self._warned_at[check] = now
                log.warning(
                    "cannot tell whether group %r finished %s queue %d on group %r: %s",
                    check.group,
                    check.topic,
                    check.queue,
                    check.before.group,
                    _why(exc),
                )
                continue
            if done:
                self._warned_at.pop(check, None)
                self._gate.passed(check)
                self._freed(check.topic)

    async def _finished(self, check: OrderCheck) -> bool:
        end = check.before.logic_end
        if end is None:
            return False
        committed, first = await self._links.consumed_to(
            check.before.group, check.group, check.topic, check.queue
        )
        return (committed is not None and committed >= end) or first >= end


def _why(exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return str(exc.details() or exc.code().name)
    return str(exc)
