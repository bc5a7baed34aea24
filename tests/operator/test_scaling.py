"""Scale-down keeps the master and min in-sync replicas; deletion waits for a drained group."""

from __future__ import annotations

from capstan.operator.roller import Action, GroupView, PodView
from capstan.operator.scaling import Backlog, Refusal, deletion_refusal, scale_down_step

PODS = [PodView(f"g-{i}", i, False, True) for i in range(3)]
ALL = frozenset(p.name for p in PODS)


def group(master: str = "g-0", in_sync: frozenset[str] = ALL) -> GroupView:
    return GroupView(master, 3, in_sync, ALL)


def test_removing_a_slave_that_is_not_needed() -> None:
    step = scale_down_step(PODS, 2, group(), 2)
    assert not isinstance(step, Refusal)
    assert (step.action, step.pod) == (Action.RESTART, "g-2")


def test_refused_below_one_or_below_min_in_sync() -> None:
    assert isinstance(scale_down_step(PODS, 0, group(), 1), Refusal)
    refused = scale_down_step(PODS, 1, group(), 2)
    assert isinstance(refused, Refusal) and "minInSyncReplicas 2" in refused.reason


def test_the_master_moves_before_its_pod_is_removed() -> None:
    step = scale_down_step(PODS, 2, group(master="g-2"), 1)
    assert not isinstance(step, Refusal)
    assert (step.action, step.pod) == (Action.SWITCH_MASTER, "g-0")


def test_waits_while_the_replicas_that_stay_are_not_in_sync_enough() -> None:
    step = scale_down_step(PODS, 2, group(in_sync=frozenset({"g-0", "g-2"})), 2)
    assert not isinstance(step, Refusal)
    assert step.action is Action.WAIT and "1 of the replicas" in step.reason


def test_at_the_desired_size_it_is_done() -> None:
    step = scale_down_step(PODS[:2], 2, group(), 1)
    assert not isinstance(step, Refusal) and step.action is Action.DONE


def test_deletion_waits_for_every_kind_of_backlog() -> None:
    assert deletion_refusal(Backlog(0, 0, 0)) is None
    refused = deletion_refusal(Backlog(12, 1, 3))
    assert refused is not None
    assert "12 unconsumed" in refused.reason
    assert "1 undecided transactional" in refused.reason
    assert "3 delayed" in refused.reason
