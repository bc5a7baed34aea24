"""The controller replicas' restarts onto a new revision (operator/controller_roller.py):
followers first, one at a time, the leader last once another replica runs the new one; and
the StatefulSet leaves those restarts to the operator (its rolling update would wait on a
follower, never Ready, forever)."""

from __future__ import annotations

from capstan.operator.controller_roller import ControllerPod, next_restart
from capstan.operator.manifests.controller import ControllerManifests
from tests.operator.test_manifests import NEW


def pod(name: str, outdated: bool = True, running: bool = True, leading: bool = False):
    return ControllerPod(name, outdated, running, leading)


def test_followers_go_first_highest_ordinal_first_then_the_leader() -> None:
    three = [pod("c-0", leading=True), pod("c-1"), pod("c-2")]
    assert next_restart(three, 3) == "c-2"
    two_left = [pod("c-0", leading=True), pod("c-1"), pod("c-2", outdated=False)]
    assert next_restart(two_left, 3) == "c-1"
    leader_left = [pod("c-0", leading=True), pod("c-1", outdated=False), pod("c-2", outdated=False)]
    assert next_restart(leader_left, 3) == "c-0"
    assert next_restart([pod("c-0", False, leading=True), pod("c-1", False)], 2) is None


def test_nothing_while_a_replica_is_starting_or_missing() -> None:
    starting = [pod("c-0", leading=True), pod("c-1", outdated=False, running=False)]
    assert next_restart(starting, 2) is None
    assert next_restart([pod("c-0", leading=True)], 2) is None  # c-1 not yet recreated


def test_the_leader_waits_until_another_replica_runs_the_new_revision() -> None:
    # A follower restarted onto the old revision (the template changed again meanwhile) is
    # outdated like the leader: it goes first, and the leader only after it.
    assert next_restart([pod("c-0", leading=True), pod("c-1")], 2) == "c-1"
    # No leader now (an election under way): the highest outdated replica goes.
    assert next_restart([pod("c-0"), pod("c-1")], 2) == "c-1"


def test_a_single_replica_is_restarted_since_no_order_avoids_the_gap() -> None:
    assert next_restart([pod("c-0", leading=True)], 1) == "c-0"


def test_the_stateful_set_leaves_restarts_to_the_operator() -> None:
    sts = ControllerManifests("shop", [], NEW, replicas=2).stateful_set()
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}
