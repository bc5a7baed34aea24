"""When a write counts as replicated: the acknowledgement rules of the send path.

RocketMQ's CommitLog decides two things for a write in controller mode, and the functions
here make the same two decisions as pure functions over plain numbers:

1. Before appending, `need_ack_nums`: how many copies (the master's included) the write must
   reach, or `IN_SYNC_REPLICAS_NOT_ENOUGH` to refuse it before anything is written, so the
   producer retries elsewhere without leaving a duplicate behind.
2. While the writer waits, `acks_reached`: whether the slaves' acknowledged offsets now
   cover the write. If the wait runs out first, the outcome is `FLUSH_SLAVE_TIMEOUT`.

The caller gathers the inputs (the SyncStateSet from the controller, the slaves' acked
offsets from the HA connections, the live replica count from the name server) and acts on
the answers.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

HA_MAX_GAP_NOT_IN_SYNC_BYTES: Final = 256 * 1024 * 1024
"""RocketMQ's default haMaxGapNotInSync: 256 MiB."""


class AckOutcome(enum.Enum):
    """The outcome of the replication step of a write (names after RocketMQ's
    PutMessageStatus)."""

    PUT_OK = "PUT_OK"
    """Enough copies hold the write."""
    IN_SYNC_REPLICAS_NOT_ENOUGH = "IN_SYNC_REPLICAS_NOT_ENOUGH"
    """Refused before writing: too few replicas are in sync to promise the copies asked for.
    Nothing was stored; another broker, or this one later, may take it."""
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    """Stored on the master, but the copies needed did not acknowledge in time. A resend may
    duplicate the message."""

    @property
    def ok(self) -> bool:
        return self is AckOutcome.PUT_OK

    @property
    def retriable(self) -> bool:
        """Whether sending the same message again may succeed."""
        return self is not AckOutcome.PUT_OK


@dataclass(frozen=True, slots=True)
class AckSettings:
    """How many copies a write needs before the producer is answered (RocketMQ's
    MessageStoreConfig fields of the same names)."""

    in_sync_replicas: int = 1
    """Copies a write needs, the master's included, when all_ack_in_sync_state_set is off.
    A count of brokers. Default 1 (the master alone, RocketMQ's default)."""

    min_in_sync_replicas: int = 1
    """Fewest replicas, the master included, that must be in sync for a write to be accepted
    at all; below it writes are refused with IN_SYNC_REPLICAS_NOT_ENOUGH. A count of brokers,
    at most in_sync_replicas. Default 1."""

    all_ack_in_sync_state_set: bool = False
    """Controller mode: a write needs every member of the SyncStateSet, however many that is,
    instead of in_sync_replicas. Default False (RocketMQ's); `safe_defaults` turns it on."""

    enable_auto_in_sync_replicas: bool = False
    """Slave-acting-master mode: lower the copies needed to what is alive and in sync, never
    below min_in_sync_replicas. Default False."""

    ha_max_gap_not_in_sync_bytes: int = HA_MAX_GAP_NOT_IN_SYNC_BYTES
    """A slave counts as in sync while it lags the master by at most this many bytes.
    Default 256 MiB (RocketMQ's haMaxGapNotInSync)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_in_sync_replicas <= self.in_sync_replicas:
            raise ValueError("need 1 <= min_in_sync_replicas <= in_sync_replicas")
        if self.ha_max_gap_not_in_sync_bytes < 0:
            raise ValueError("ha_max_gap_not_in_sync_bytes must not be negative")

    @classmethod
    def safe_defaults(cls, replicas: int) -> AckSettings:
        """Settings under which an acknowledged write survives losing any one broker.

        With 2 or more replicas a write waits for the whole SyncStateSet, so every broker the
        controller may elect holds it. Writes are refused below a majority in sync (3+
        replicas); with 2 the master may go on alone once the controller has dropped the
        slave from the set, as RocketMQ recommends for two-replica groups.
        """
        if replicas < 1:
            raise ValueError(f"replicas must be at least 1, not {replicas}")
        if replicas == 1:
            return cls(in_sync_replicas=1, min_in_sync_replicas=1)
        return cls(
            in_sync_replicas=replicas,
            min_in_sync_replicas=replicas // 2 + 1 if replicas >= 3 else 1,
            all_ack_in_sync_state_set=True,
        )


def need_ack_nums(
    settings: AckSettings,
    *,
    sync_state_set_size: int,
    in_sync_count: int,
    alive_replicas: int,
    slave_acting_master: bool,
) -> int | AckOutcome:
    """Copies (the master's included) a new write must reach, or IN_SYNC_REPLICAS_NOT_ENOUGH.

    `in_sync_count` comes from `in_sync_count()` and counts the master. The write is refused
    when fewer than min_in_sync_replicas are in sync; when it would need more copies than are
    in sync (it could only time out, after being stored); and in all-ack mode when the
    SyncStateSet is smaller than min_in_sync_replicas (the controller counts too few brokers
    electable, whatever the byte gaps say). In slave-acting-master mode there is no
    SyncStateSet: what counts as in sync is also capped by `alive_replicas`, and
    all_ack_in_sync_state_set does not apply.
    """
    if sync_state_set_size < 1 or in_sync_count < 1 or alive_replicas < 0:
        raise ValueError("the master is always in sync and in the SyncStateSet")
    if in_sync_count < settings.min_in_sync_replicas:
        return AckOutcome.IN_SYNC_REPLICAS_NOT_ENOUGH
    if slave_acting_master:
        available = min(alive_replicas, in_sync_count)
        need = _slave_acting_need(settings, available)
    else:
        available = in_sync_count
        need = _controller_need(settings, sync_state_set_size)
    if not settings.min_in_sync_replicas <= need <= available:
        return AckOutcome.IN_SYNC_REPLICAS_NOT_ENOUGH
    return need


def _controller_need(settings: AckSettings, sync_state_set_size: int) -> int:
    if settings.all_ack_in_sync_state_set:
        return sync_state_set_size
    return settings.in_sync_replicas


def _slave_acting_need(settings: AckSettings, available: int) -> int:
    if not settings.enable_auto_in_sync_replicas:
        return settings.in_sync_replicas
    return max(min(settings.in_sync_replicas, available), settings.min_in_sync_replicas)


def in_sync_count(master_offset: int, slave_acked: Mapping[int, int], gap_bytes: int) -> int:
    """The master plus every slave whose acked offset lags `master_offset` by at most
    `gap_bytes`.

    A slave can report more than `master_offset` only when that offset was read before the
    slave's latest ack; it is in sync.
    """
    if gap_bytes < 0:
        raise ValueError("gap_bytes must not be negative")
    return 1 + sum(1 for acked in slave_acked.values() if master_offset - acked <= gap_bytes)


def acks_reached(
    target_offset: int,
    need: int,
    acked: Mapping[int, int],
    sync_state_set: frozenset[int] | None,
    quorum: bool = False,
) -> bool:
    """Whether a write ending at `target_offset` now has `need` copies.

    `acked` maps slave broker ids to the offset each has acknowledged; the master is counted
    without being listed, since it wrote the bytes. With `sync_state_set` (all-ack mode, the
    set as it is now, the master among its members) only members count and every member
    must hold the write. `need` still applies then: if the set shrank below the copies the
    write was accepted with, it waits (and times out) rather than settle for fewer. RocketMQ
    settles for the smaller set; here the promise made when accepting the write is kept.
    With `quorum` (a controller's group acknowledging by quorum), `need` copies among the
    members settle it, whoever the others are: one stalled member holds nothing back.
    """
    if need < 1:
        raise ValueError(f"need must be at least 1, not {need}")
    holders = [slave for slave, offset in acked.items() if offset >= target_offset]
    if sync_state_set is None:
        return 1 + len(holders) >= need
    copies = 1 + sum(1 for slave in holders if slave in sync_state_set)
    if quorum:
        return copies >= need
    return copies >= max(need, len(sync_state_set))


def quorum_offset(master_max_offset: int, member_offsets: list[int], need: int) -> int:
    """The offset `need` copies hold, the master's among them: the `need`-th highest of the
    master's max offset and its members' acked offsets (the lowest when there are fewer).
    What a group acknowledging by quorum may let consumers read: any election among enough
    members (controller/election.py) keeps it."""
    held = sorted([master_max_offset, *member_offsets], reverse=True)
    return held[min(need, len(held)) - 1]
