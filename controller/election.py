"""Master election for one broker group: RocketMQ 5's DefaultElectPolicy, made safe.

The controller calls `elect_master` when a master's heartbeats stop, when a broker asks for
a master, and when an operator asks for a switchover. It is pure: the caller gathers the
replicas' heartbeats into `Candidate`s and persists the returned `ReplicaInfo`.

What "made safe" means here, against the Java policy it follows:

* the choice is deterministic: the highest (epoch, max offset) wins and ties go to the
  smallest id, where the Java policy may fall back to an arbitrary member of a hash set;
* a dead master is never elected, and a group nobody can lead gets no master rather than a
  guess; its master epoch still rises, so the old master is fenced if it comes back;
* an out-of-sync replica leads only with `unclean=True`, because it lacks messages the old
  master acknowledged to producers;
* a group that never had a master (master epoch 0) has confirmed nothing, so any registered
  replica may lead it cleanly; without this a fresh group, whose SyncStateSet is empty, could
  only ever be started by an unclean election (RocketMQ's "first time for elect");
* a master that restarted before its heartbeats were missed is still the master here, but it
  may have come back with less than it had (an unflushed tail lost with its machine's power)
  while a slave holds all of it. Had it resumed, the slave would cut its log back to the
  master's end when it reconnects, losing acknowledged messages. So when the master reports
  that it does not lead (`master_leading=False`, only ever from its own fresh report) and a
  live SyncStateSet member holds more (a higher epoch, or the same epoch and a higher
  offset), that member is elected at a new epoch; the restarted master follows it and, its
  log being a prefix of the member's, copies what it lost. A leading master is never
  compared: a slave's heartbeat may be fresher than the master's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from capstan.controller.replica_info import ReplicaInfo, format_ids


@dataclass(frozen=True)
class Candidate:
    """What the controller knows of one replica from its last heartbeat.

    `epoch` is the last master epoch in the replica's epoch file and `max_offset` its
    CommitLog max offset: together they say how much of the group's history it holds. A
    replica with no heartbeat on record counts as dead.
    """

    broker_id: int
    alive: bool
    epoch: int
    max_offset: int
    final_at_epoch: int = 0
    """Nonzero when the replica follows no master, as of that group master epoch: its
    max_offset is where its log ends until a later master is named."""


@dataclass(frozen=True)
class Election:
    """The outcome: who leads (None: nobody, writes must be refused), the state to persist,
    and why, in words an operator reads in `capstan cluster` output and in the logs."""

    master_id: int | None
    info: ReplicaInfo
    reason: str


def elect_master(
    info: ReplicaInfo,
    candidates: Mapping[int, Candidate],
    *,
    preferred: int | None = None,
    unclean: bool = False,
    master_leading: bool = True,
    ack_quorum: int = 0,
) -> Election:
    """Decide the group's master from its state and the replicas' heartbeats.

    A live master stays unless an operator names another broker (`preferred`), or it has
    just reported that it does not lead (`master_leading=False`: it restarted) and a live
    SyncStateSet member holds more than it does; a named broker that may not lead leaves
    everything as it was. Otherwise the most up-to-date live member of the SyncStateSet
    leads, or, only with `unclean`, of all registered replicas. Before the group's first
    master every registered replica counts as in sync.

    `ack_quorum` (nonzero: the group acknowledges a write once that many SyncStateSet
    members hold it, the master's copy included, fewer than all of them): a member may lack
    an acknowledged write, so a dead master is replaced in two steps. First it is deposed
    (no master, a new epoch: every slave stops copying). Then, once at least
    |SyncStateSet| - ack_quorum + 1 live members report that they follow no master at that
    epoch, the one holding the most among them leads: of any that many members, one holds
    every acknowledged write.
    """
    _check_keys(candidates)
    if preferred is not None:
        return _switch_over(info, candidates, preferred, unclean)
    if not _alive(candidates, info.master_id):
        if 0 < ack_quorum < len(info.sync_state_set) and not _never_led(info):
            return _elect_by_quorum(info, candidates, unclean, ack_quorum)
        return _elect_best(info, candidates, unclean)
    replaced = None if master_leading else _replace_restarted_master(info, candidates)
    if replaced is not None:
        return replaced
    return Election(info.master_id, info, f"master {info.master_id} is alive")


def _check_keys(candidates: Mapping[int, Candidate]) -> None:
    for broker_id, candidate in candidates.items():
        if broker_id != candidate.broker_id:
            raise ValueError(f"candidate {candidate} is filed under broker id {broker_id}")


def _alive(candidates: Mapping[int, Candidate], broker_id: int | None) -> bool:
    candidate = candidates.get(broker_id) if broker_id is not None else None
    return candidate is not None and candidate.alive


def _switch_over(
    info: ReplicaInfo, candidates: Mapping[int, Candidate], preferred: int, unclean: bool
) -> Election:
    refusal = _switch_over_refusal(info, candidates, preferred, unclean)
    if refusal is not None:
        return Election(info.master_id, info, refusal)
    reason = f"switched the master from {info.master_id} to the preferred broker {preferred}"
    if preferred not in _clean_pool(info):
        reason += f" by unclean election: it is outside the SyncStateSet {_ids(info)}"
    return Election(preferred, _with_master(info, preferred), reason)


def _switch_over_refusal(
    info: ReplicaInfo, candidates: Mapping[int, Candidate], preferred: int, unclean: bool
) -> str | None:
    if preferred not in info.replicas:
        return f"preferred broker {preferred} is not a registered replica of {info.group!r}"
    if not _alive(candidates, preferred):
        return f"preferred broker {preferred} is not alive"
    if preferred == info.master_id:
        return f"preferred broker {preferred} is already the master"
    if preferred not in _clean_pool(info) and not unclean:
        return (
            f"preferred broker {preferred} is not in the SyncStateSet {_ids(info)};"
            " unclean election disabled"
        )
    return None


def _never_led(info: ReplicaInfo) -> bool:
    return info.master_id is None and info.master_epoch == 0


def _clean_pool(info: ReplicaInfo) -> frozenset[int]:
    """The replicas known to hold every confirmed message: the SyncStateSet, or, before the
    group's first master, every registered replica, since nothing was confirmed yet."""
    return info.replicas if _never_led(info) else info.sync_state_set


def _clean_pool_name(info: ReplicaInfo) -> str:
    if _never_led(info):
        return f"the replicas {format_ids(info.replicas)} (first master of the group)"
    return f"the SyncStateSet {_ids(info)}"


def _elect_best(info: ReplicaInfo, candidates: Mapping[int, Candidate], unclean: bool) -> Election:
    in_sync = _live(candidates, _clean_pool(info))
    if in_sync:
        winner = _best(in_sync)
        reason = f"elected {_describe(winner)} from {_clean_pool_name(info)}"
        return _elected(info, winner, reason)
    no_sync = f"no live replica in {_clean_pool_name(info)}"
    if _never_led(info):
        return _no_master(info, no_sync)  # the clean pool was every replica already
    if not unclean:
        return _no_master(info, f"{no_sync}; unclean election disabled")
    return _elect_unclean(info, candidates, no_sync)


def _elect_by_quorum(
    info: ReplicaInfo, candidates: Mapping[int, Candidate], unclean: bool, ack_quorum: int
) -> Election:
    members = info.sync_state_set
    if info.master_id is not None:
        return _no_master(
            info,
            f"master {info.master_id} is gone; writes were acknowledged by {ack_quorum} of"
            f" the SyncStateSet {_ids(info)}, so its members stop copying before the one"
            " holding the most is elected",
        )
    final = [c for c in _live(candidates, members) if c.final_at_epoch == info.master_epoch]
    required = len(members) - ack_quorum + 1
    if len(final) >= required:
        winner = _best(final)
        return _elected(
            info,
            winner,
            f"elected {_describe(winner)}, holding the most of {len(final)} members of the"
            f" SyncStateSet {_ids(info)} that stopped copying ({required} needed: each"
            f" acknowledged write is on {ack_quorum} members)",
        )
    waiting = (
        f"{len(final)} of the SyncStateSet {_ids(info)} reported where their logs end;"
        f" {required} needed before electing"
    )
    if unclean:
        return _elect_unclean(info, candidates, waiting)
    return Election(None, info, f"{waiting}; the group has no master")


def _elect_unclean(
    info: ReplicaInfo, candidates: Mapping[int, Candidate], no_sync: str
) -> Election:
    registered = _live(candidates, info.replicas)
    if not registered:
        return _no_master(info, f"{no_sync} nor among the replicas {format_ids(info.replicas)}")
    winner = _best(registered)
    reason = f"{no_sync}; unclean election of {_describe(winner)}, messages it lacks are lost"
    return _elected(info, winner, reason)


def _replace_restarted_master(
    info: ReplicaInfo, candidates: Mapping[int, Candidate]
) -> Election | None:
    """The live master said it does not lead (it restarted): elect the live SyncStateSet
    member holding the most, if that is more than the master holds; None to keep it."""
    assert info.master_id is not None
    master = candidates[info.master_id]
    ahead = [
        c
        for c in _live(candidates, info.sync_state_set)
        if (c.epoch, c.max_offset) > (master.epoch, master.max_offset)
    ]
    if not ahead:
        return None
    winner = _best(ahead)
    reason = (
        f"master {_describe(master)} restarted holding less than {_describe(winner)};"
        f" elected {winner.broker_id} from the SyncStateSet {_ids(info)},"
        f" {master.broker_id} follows it and copies what it lost"
    )
    return _elected(info, winner, reason)


def _live(candidates: Mapping[int, Candidate], ids: Collection[int]) -> list[Candidate]:
    found = (candidates.get(i) for i in ids)
    return [c for c in found if c is not None and c.alive]


def _best(pool: list[Candidate]) -> Candidate:
    """The replica holding the most history; ties to the smallest id, so every run agrees."""
    return min(pool, key=lambda c: (-c.epoch, -c.max_offset, c.broker_id))


def _describe(candidate: Candidate) -> str:
    return f"broker {candidate.broker_id} (epoch {candidate.epoch}, offset {candidate.max_offset})"


def _ids(info: ReplicaInfo) -> str:
    return format_ids(info.sync_state_set)


def _elected(info: ReplicaInfo, winner: Candidate, reason: str) -> Election:
    return Election(winner.broker_id, _with_master(info, winner.broker_id), reason)


def _with_master(info: ReplicaInfo, master_id: int) -> ReplicaInfo:
    """A new master starts alone in the SyncStateSet: the others re-join once they have
    caught up with it, because only then is it known that they hold what it holds."""
    return replace(
        info,
        master_id=master_id,
        master_epoch=info.master_epoch + 1,
        sync_state_set=frozenset({master_id}),
        sync_state_set_epoch=info.sync_state_set_epoch + 1,
    )


def _no_master(info: ReplicaInfo, reason: str) -> Election:
    """Leave the group without a master; bump the epoch only if that deposes one, so a
    returning old master finds itself fenced. The SyncStateSet stays: its members are still
    the replicas known to hold everything, the first to consider once they return."""
    if info.master_id is None:
        return Election(None, info, f"{reason}; the group has no master")
    fenced = replace(info, master_id=None, master_epoch=info.master_epoch + 1)
    reason += f"; master {info.master_id} deposed at master epoch {fenced.master_epoch}"
    return Election(None, fenced, reason)
