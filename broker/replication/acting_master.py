"""Slave-acting-master: a group without a controller keeps its master-only duties while
its master is gone (RocketMQ's enableSlaveActingMaster).

- Who acts: while no master answers probes (peer_watch.py), the live slave with the
  smallest broker id. It serves offset commits, queue locks, pop and ack, runs the timer,
  the transaction checks and pop revive, and stores what those produce on another group's
  master (escape.py). It still refuses new writes, and its routes mark the queues
  read-only. Every other slave passes calls on to it.
- It stops when the master answers again.
- Taking back: the master has a generation, raised each time it starts serving. A slave
  that begins acting records the generation it acts over and, until the master has taken
  its changes back, keeps them (it ignores the master's metadata). The master takes back
  from every live slave that acted over its current generation: when it starts, before it
  serves (then it raises its generation), and whenever a probe shows one (a master that
  was only paused). Changes made over an older generation are dropped: the master has
  served without them since.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Protocol

import grpc

from capstan.broker.replication.peer_watch import PeerWatch
from capstan.common.broker_settings import ReplicationSettings
from capstan.common.durable_files import replace_durably
from capstan.v1 import replication_pb2 as pb

log = logging.getLogger(__name__)

TAKE_BACK_TIMEOUT_S = 5.0
NOBODY = "-"
"""What `duty_address` answers while the group's master is gone and no replica serves its
duties yet: the edge then answers calls UNAVAILABLE (retry shortly) rather than a stale
local answer."""


def should_act(own_id: int, master_alive: bool, live_slave_ids: Iterable[int]) -> bool:
    """Whether this slave acts for the master: the master is gone and no live slave has a
    smaller id."""
    return not master_alive and all(own_id < other for other in live_slave_ids)


@dataclass
class ActingRecord:
    """Kept in `state/acting_master.json`."""

    generation: int = 0
    """The master's: its own current generation. A slave's: the last one it saw."""
    acted_over: int = -1
    """A slave's: the generation it acted over, until the master takes it back."""
    acted_since_ms: int = 0

    @classmethod
    def load(cls, path: Path) -> ActingRecord:
        try:
            data = json.loads(path.read_text())
            return cls(**{f.name: int(data[f.name]) for f in fields(cls)})
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is unreadable ({exc}); move it away to start over") from exc

    def save(self, path: Path) -> None:
        replace_durably(path, json.dumps(asdict(self)).encode())


class ActingHost(Protocol):
    """What the broker does for slave-acting-master."""

    async def start_acting(self) -> None: ...

    async def stop_acting(self) -> None: ...

    def taken_back(self) -> pb.Metadata: ...

    async def adopt_taken_back(self, state: pb.Metadata) -> None: ...

    async def copy_afresh(self) -> None:
        """Reopen the stream to the master, so its metadata arrives whole."""


class ActingMaster:
    """A broker's part in its group's watch, without a controller. Use from the event loop."""

    def __init__(
        self,
        settings: ReplicationSettings,
        broker_name: str,
        is_master: bool,
        record_path: Path,
        host: ActingHost,
    ) -> None:
        self.settings = settings
        self.broker_name = broker_name
        self.own_id = settings.broker_id
        self.is_master = is_master
        self.enabled = settings.slave_acting_master
        self._path = record_path
        self._host = host
        self.record = ActingRecord.load(record_path)
        self.acting = False
        self._master_heard_at = -float("inf")
        addresses = [a for i, a in sorted(settings.peer_addresses.items()) if i != self.own_id]
        if settings.master_address and settings.master_address not in addresses:
            addresses.insert(0, settings.master_address)
        self.watch = PeerWatch(
            broker_name,
            self.own_id,
            addresses,
            settings.heartbeat_interval_ms / 1000,
            settings.peer_timeout_ms / 1000,
            self._after_round,
        )

    @property
    def holds_acted_state(self) -> bool:
        """A slave keeps its own offsets and progress until the master takes them back."""
        return self.record.acted_over >= 0

    def start(self) -> None:
        self.watch.start()

    async def stop(self) -> None:
        await self.watch.stop()
        if self.acting:
            await self._stop_acting("the broker stops")

    # -- where calls go ----------------------------------------------------------------

    def master_alive(self) -> bool:
        if self.is_master:
            return True
        heard = time.monotonic() - self._master_heard_at <= self.watch.timeout_s
        return heard or any(r.role == "master" for r in self.watch.alive())

    def duty_address(self) -> str:
        """Where this broker passes calls on to: the master while it answers, else the
        acting slave; "" when this broker serves them itself; NOBODY while the master is
        gone and no slave acts yet (without slave-acting-master, a slave then serves
        what it can itself)."""
        if self.is_master or self.acting:
            return ""
        alive = self.watch.alive()
        for role in ("master", "slave"):
            for reply in alive:
                if reply.role == role and (role == "master" or reply.acting):
                    return self.watch.address_of(reply.broker_id)
        if self.master_alive():  # it reached this broker, not yet answered a probe
            return self.settings.master_address
        return NOBODY if self.enabled else ""

    def probe_reply(self, max_offset: int) -> pb.ProbeReply:
        return pb.ProbeReply(
            broker_name=self.broker_name,
            broker_id=self.own_id,
            role="master" if self.is_master else "slave",
            acting=self.acting,
            master_generation=self.record.generation,
            acted_over_generation=self.record.acted_over,
            max_offset=max_offset,
        )

    # -- the slave's side --------------------------------------------------------------

    async def _after_round(self) -> None:
        if self.is_master:
            if self.enabled:
                await self.take_back()
            return
        alive = self.watch.alive()
        master = next((r for r in alive if r.role == "master"), None)
        if master is not None and master.master_generation != self.record.generation:
            self.record.generation = master.master_generation
            self.record.save(self._path)
        act = self.enabled and should_act(
            self.own_id, self.master_alive(), [r.broker_id for r in alive if r.role == "slave"]
        )
        if act and not self.acting:
            await self._start_acting()
        elif not act and self.acting:
            await self._stop_acting("the master answers again" if master else "a lower id acts")

    async def _start_acting(self) -> None:
        if not self.holds_acted_state:
            self.record.acted_over = self.record.generation
            self.record.acted_since_ms = int(time.time() * 1000)
            self.record.save(self._path)
        self.acting = True
        log.warning(
            "broker %d of %s acts for its absent master (generation %d)",
            self.own_id,
            self.broker_name,
            self.record.acted_over,
        )
        await self._host.start_acting()

    async def _stop_acting(self, why: str) -> None:
        self.acting = False
        await self._host.stop_acting()
        log.warning(
            "broker %d of %s stops acting for the master: %s", self.own_id, self.broker_name, why
        )

    async def hand_back(self, generation: int) -> pb.TakeBackReply:
        """The master asks for what this slave changed while acting over `generation`."""
        self._master_heard_at = time.monotonic()
        if self.acting:
            await self._stop_acting("the master takes back")
        acted = self.holds_acted_state and self.record.acted_over == generation
        reply = pb.TakeBackReply(acted=acted, acted_since_ms=self.record.acted_since_ms)
        if acted:
            reply.state.CopyFrom(self._host.taken_back())
        elif self.holds_acted_state:
            log.warning(
                "dropping what was changed while acting over master generation %d: the "
                "master has served without it since (generation %d)",
                self.record.acted_over,
                generation,
            )
        had = self.holds_acted_state
        self.record.acted_over = -1
        self.record.generation = generation
        self.record.save(self._path)
        if had:
            await self._host.copy_afresh()
        return reply

    # -- the master's side -------------------------------------------------------------

    async def reclaim(self) -> None:
        """Before the master serves: take back what slaves changed while it was gone, then
        start a new generation."""
        await self.watch.probe_all(TAKE_BACK_TIMEOUT_S)
        await self.take_back()
        self.record.generation += 1
        self.record.save(self._path)
        log.info("master of %s serves as generation %d", self.broker_name, self.record.generation)

    async def take_back(self) -> None:
        """Take back from every live slave holding acted state; the latest acting wins."""
        holders = [r for r in self.watch.alive() if r.acted_over_generation >= 0]
        replies = []
        for reply in holders:
            address = self.watch.address_of(reply.broker_id)
            request = pb.TakeBackRequest(
                broker_name=self.broker_name, master_generation=self.record.generation
            )
            try:
                answer = await self.watch.stub(address).TakeBack(
                    request, timeout=TAKE_BACK_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.warning("taking back from %s failed: %s", address, exc.details())
                continue
            if answer.acted:
                replies.append((answer.acted_since_ms, reply.broker_id, answer.state))
        for since, broker_id, state in sorted(replies, key=lambda r: (r[0], r[1])):
            log.warning(
                "master of %s takes back what broker %d changed while acting (since %d)",
                self.broker_name,
                broker_id,
                since,
            )
            await self._host.adopt_taken_back(state)
