"""The roller's order: slaves first, one at a time, never below min in-sync, then the
master moved to an updated caught-up slave before the old master restarts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from capstan.operator.roller import Action, GroupView, PodView, Step, next_step

PODS = ("g-0", "g-1", "g-2")


def pods(outdated: set[str], not_ready: frozenset[str] = frozenset()) -> list[PodView]:
    return [PodView(n, i, n in outdated, n not in not_ready) for i, n in enumerate(PODS)]


def group(master: str | None = "g-0", in_sync: set[str] | None = None, epoch: int = 1) -> GroupView:
    return GroupView(master, epoch, frozenset(in_sync or PODS), frozenset(PODS))


def test_nothing_outdated_is_done() -> None:
    assert next_step(pods(set()), group(), 2).action is Action.DONE


def test_slaves_first_highest_ordinal_first() -> None:
    step = next_step(pods(set(PODS)), group("g-0"), 2)
    assert step == Step(Action.RESTART, "g-2", step.reason)
    assert "2 of min 2" in step.reason


def test_waits_while_a_pod_is_not_ready() -> None:
    step = next_step(pods({"g-1"}, frozenset({"g-2"})), group(), 2)
    assert step.action is Action.WAIT and "g-2" in step.reason


def test_waits_while_the_controller_has_not_seen_a_replica() -> None:
    seen = replace(group(), alive=frozenset({"g-0", "g-1"}))
    step = next_step(pods({"g-1"}), seen, 2)
    assert step.action is Action.WAIT and "g-2" in step.reason


def test_a_slave_out_of_sync_may_restart_but_not_one_that_would_drop_below_min() -> None:
    # g-2 is not in the set: restarting it costs nothing. g-1 is: only 1 of min 2 would stay.
    assert next_step(pods({"g-2"}), group(in_sync={"g-0", "g-1"}), 2).pod == "g-2"
    step = next_step(pods({"g-1"}), group(in_sync={"g-0", "g-1"}), 2)
    assert step.action is Action.WAIT and "g-1" in step.reason


def test_only_the_master_outdated_moves_leadership_to_an_updated_in_sync_slave() -> None:
    step = next_step(pods({"g-0"}), group("g-0", epoch=4), 2)
    assert step == Step(Action.SWITCH_MASTER, "g-1", step.reason)
    assert "epoch 4" in step.reason


def test_no_caught_up_updated_slave_means_wait_not_restart_the_master() -> None:
    step = next_step(pods({"g-0"}), group("g-0", in_sync={"g-0"}), 1)
    assert step.action is Action.WAIT


def test_a_group_without_master_waits() -> None:
    assert next_step(pods(set(PODS)), group(None), 1).action is Action.WAIT


def test_a_single_replica_restarts_when_its_minimum_allows() -> None:
    one = [PodView("g-0", 0, True, True)]
    solo = GroupView("g-0", 1, frozenset({"g-0"}), frozenset({"g-0"}))
    assert next_step(one, solo, 1).action is Action.RESTART
    assert next_step(one, solo, 2).action is Action.WAIT


@pytest.mark.parametrize(("replicas", "min_in_sync"), [(2, 1), (3, 1), (3, 2), (5, 2), (5, 4)])
def test_a_whole_roll_keeps_min_in_sync_and_restarts_the_master_last(
    replicas: int, min_in_sync: int
) -> None:
    """Play the roll against a model group: a restarted pod comes back updated and ready
    but out of the set, and catches up two rounds later; a switch makes the target master."""
    names = [f"g-{i}" for i in range(replicas)]
    outdated = set(names)
    in_sync = set(names)
    master, epoch = "g-0", 1
    restarted: list[str] = []
    catching_up: dict[str, int] = {}  # pod -> rounds until it is in sync again
    for _ in range(10 * replicas):
        for pod, rounds in list(catching_up.items()):
            if rounds == 0:
                in_sync.add(pod)
                del catching_up[pod]
            else:
                catching_up[pod] = rounds - 1
        view = [PodView(n, i, n in outdated, True) for i, n in enumerate(names)]
        step = next_step(
            view, GroupView(master, epoch, frozenset(in_sync), frozenset(names)), min_in_sync
        )
        if step.action is Action.DONE:
            break
        if step.action is Action.RESTART:
            assert step.pod != master
            in_sync.discard(step.pod)
            assert len(in_sync) >= min_in_sync
            outdated.discard(step.pod)
            restarted.append(step.pod)
            catching_up[step.pod] = 2
        elif step.action is Action.SWITCH_MASTER:
            assert step.pod in in_sync and step.pod not in outdated
            master, epoch = step.pod, epoch + 1
    else:
        pytest.fail(f"the roll did not finish: {restarted}")
    assert sorted(restarted) == names
    assert restarted[-1] == "g-0"
    assert restarted[:-1] == sorted(names[1:], key=lambda n: -int(n.split("-")[1]))


def test_min_in_sync_equal_to_replicas_never_restarts_and_says_why() -> None:
    step = next_step(pods({"g-1", "g-2"}), group(), 3)
    assert step.action is Action.WAIT
    assert "g-2, g-1" in step.reason and "min 3" in step.reason


def test_an_outdated_pod_that_cannot_start_is_restarted_before_anything_else() -> None:
    # A fixed spec reaches a pod stuck on a missing image though nothing else is settled:
    # another pod not ready, no master, the controller never having seen the stuck pod.
    views = [
        PodView("g-0", 0, False, False),
        PodView("g-1", 1, True, False, stuck=True),
        PodView("g-2", 2, True, True),
    ]
    seen = GroupView(None, 1, frozenset(), frozenset({"g-2"}))
    step = next_step(views, seen, 2)
    assert step == Step(Action.RESTART, "g-1", step.reason)
    assert "cannot start" in step.reason


def test_a_stuck_pod_already_at_the_update_revision_is_left_alone() -> None:
    views = [PodView("g-0", 0, False, True), PodView("g-1", 1, False, False, stuck=True)]
    assert next_step(views, group(in_sync={"g-0"}), 1).action is Action.DONE
