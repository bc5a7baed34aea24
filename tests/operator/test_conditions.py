"""Conditions keep their transition time until their status changes."""

from __future__ import annotations

import pytest

from capstan.operator.conditions import (
    Condition,
    degraded,
    merged,
    progressing,
    ready,
    unobserved,
)


def test_transition_time_moves_only_with_the_status() -> None:
    first = merged([], progressing("RollingUpdate", "restarting g-2"), 1, now="T1")
    assert [c["type"] for c in first] == ["Ready", "Progressing", "Degraded"]
    assert first[1] == {
        "type": "Progressing",
        "status": "True",
        "observedGeneration": 1,
        "lastTransitionTime": "T1",
        "reason": "RollingUpdate",
        "message": "restarting g-2",
    }
    second = merged(first, progressing("RollingUpdate", "restarting g-1"), 2, now="T2")
    assert second[1]["lastTransitionTime"] == "T1"
    assert second[1]["message"] == "restarting g-1"
    assert second[1]["observedGeneration"] == 2
    third = merged(second, ready("3 of 3 replicas"), 2, now="T3")
    assert {c["type"]: c["lastTransitionTime"] for c in third} == {
        "Ready": "T3",
        "Progressing": "T3",
        "Degraded": "T1",
    }


def test_degraded_can_keep_ready() -> None:
    kept = {c.type: c.status for c in degraded("ScaleDownRefused", "no", still_ready=True)}
    assert kept == {"Ready": True, "Progressing": False, "Degraded": True}


def test_a_change_applied_to_a_serving_group_keeps_it_ready_since_it_was() -> None:
    """A spec change (new claim size, a new listener) on a group that serves: Ready stays
    True, from the same time, while Progressing says what is applied."""
    serving = merged([], ready("2/2 ready"), 1, now="T1")
    applied = merged(
        serving, progressing("Applied", "children applied", still_ready=True), 2, now="T2"
    )
    by_type = {c["type"]: c for c in applied}
    assert by_type["Ready"]["status"] == "True" and by_type["Ready"]["lastTransitionTime"] == "T1"
    assert by_type["Progressing"]["status"] == "True"
    assert by_type["Progressing"]["reason"] == "Applied"


def test_a_group_that_cannot_be_asked_is_neither_ready_nor_degraded_but_unknown() -> None:
    shown = merged([], unobserved("ControllerUnreachable", "timed out; retrying"), 3, now="T")
    assert [(c["type"], c["status"]) for c in shown] == [
        ("Ready", "Unknown"),
        ("Progressing", "True"),
        ("Degraded", "Unknown"),
    ]
    assert {c["reason"] for c in shown} == {"ControllerUnreachable"}


def test_reason_must_be_camel_case() -> None:
    with pytest.raises(ValueError, match="CamelCase"):
        merged([], [Condition("Ready", None, "not camel")], 1)
