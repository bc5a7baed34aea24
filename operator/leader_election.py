"""One acting operator among its replicas: the holder of the Lease `capstan-operator` in the
operator's namespace (capstan/kube/lease.py) runs Kopf; the others stand by. The acting
replica labels its pod `capstan.io/operator-acting: "true"` (every replica sets "false" on
its pod as it starts), and the webhook Service selects that label, so the API server's
admission calls reach the one replica that serves them. /readyz says the same.

The leader renews every RENEW_S seconds. A leader that cannot renew for RENEW_DEADLINE_S
stops acting (Kopf's stop flag), and if Kopf has not stopped by the time its Lease could
lapse it exits at once: a standby takes the Lease only once it lapsed, so two replicas never
act together. A leader that stops on SIGTERM (a rolling update, a drain) gives the Lease up,
and a standby takes over within its next try (TRY_S), not a whole lease later.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from capstan.common.errors import CapstanError
from capstan.kube.lease import CoordinationLease

log = logging.getLogger(__name__)

LEASE_NAME = "capstan-operator"
DURATION_S = 15.0
"""How long a Lease holds without a renewal (client-go's default)."""
RENEW_S = 2.0
RENEW_DEADLINE_S = 10.0
"""A leader that has not renewed for this long stops acting (client-go's default)."""
TRY_S = 2.0
"""How often a standby tries to take the Lease."""
EXIT_MARGIN_S = 1.0
"""A leader that lost its Lease is gone this long before the Lease can lapse."""


def identity() -> str:
    """This process's name in the Lease: its pod's and a random part (a container restarted
    in the same pod is another holder, and waits for the dead one's Lease to lapse like any
    standby), else its host and process."""
    pod = os.environ.get("POD_NAME")
    if pod:
        return f"{pod}_{uuid.uuid4().hex[:8]}"
    return f"{socket.gethostname()}-{os.getpid()}"


ACTING_LABEL = "capstan.io/operator-acting"


@dataclass
class LeaderElection:
    lease: CoordinationLease
    holder: str
    clock: Callable[[], float] = time.monotonic
    renewed_at: float | None = None
    """When the Lease was last taken or renewed (this process's monotonic clock); None
    while standing by."""

    @property
    def leading(self) -> bool:
        return self.renewed_at is not None

    async def _try(self) -> bool:
        # The renewal counts from before it was sent: the renewTime it writes is no earlier,
        # so the Lease never lapses for the others before it does by this clock.
        sent_at = self.clock()
        try:
            held = await asyncio.to_thread(self.lease.try_lead, self.holder, DURATION_S)
        except CapstanError as exc:  # an unreachable API server: try again later
            log.warning("could not reach %s: %s", self.lease.where, exc)
            return False
        if held:
            self.renewed_at = sent_at
        return held

    async def _renew_by_deadline(self) -> bool:
        """One renewal, given up once RENEW_DEADLINE_S have passed since the last one: a
        call the API server leaves hanging (each may take its 10-s request timeout) must not
        keep this replica acting past its deadline. A renewal that lands after it was given
        up only holds the Lease longer, delaying a standby; it never makes two act."""
        assert self.renewed_at is not None
        left_s = self.renewed_at + RENEW_DEADLINE_S - self.clock()
        if left_s <= 0:
            return False
        try:
            async with asyncio.timeout(left_s):
                return await self._try()
        except TimeoutError:
            log.warning("renewing %s took past the renew deadline", self.lease.where)
            return False

    async def wait_to_lead(self, stopping: asyncio.Event) -> bool:
        """Take the Lease, waiting for it as long as it takes; False when `stopping` came
        first."""
        said = False
        while not stopping.is_set():
            if await self._try():
                log.info("leading: %s is held by %s", self.lease.where, self.holder)
                return True
            if not said:
                holding = await asyncio.to_thread(_holding_or_none, self.lease)
                log.info(
                    "standing by: %s is held by %s",
                    self.lease.where,
                    holding or "another replica",
                )
                said = True
            try:
                await asyncio.wait_for(stopping.wait(), TRY_S)
            except TimeoutError:
                pass
        return False

    async def keep(self, lost: asyncio.Event) -> None:
        """Renew until cancelled; set `lost` once renewals failed for RENEW_DEADLINE_S, and
        end the process if it still runs when the Lease could lapse."""
        while True:
            assert self.renewed_at is not None
            to_deadline_s = self.renewed_at + RENEW_DEADLINE_S - self.clock()
            await asyncio.sleep(max(0.0, min(RENEW_S, to_deadline_s)))
            if await self._renew_by_deadline():
                continue
            since = self.clock() - self.renewed_at
            if since < RENEW_DEADLINE_S:
                continue
            log.error(
                "lost %s (not renewed for %.0f s): stopping, so another replica may lead",
                self.lease.where,
                since,
            )
            lost.set()
            await asyncio.sleep(max(0.0, DURATION_S - EXIT_MARGIN_S - since))
            log.error("still running when %s could lapse: exiting now", self.lease.where)
            os._exit(3)

    async def resign(self) -> None:
        """Give the Lease up, so a standby takes it at once."""
        if not self.leading:
            return
        self.renewed_at = None
        try:
            await asyncio.to_thread(self.lease.resign, self.holder)
        except CapstanError as exc:
            log.warning("could not give up %s (it lapses by itself): %s", self.lease.where, exc)


def _holding_or_none(lease: CoordinationLease) -> str | None:
    try:
        holding = lease.holding()
    except CapstanError:
        return None
    return None if holding is None else holding.holder
