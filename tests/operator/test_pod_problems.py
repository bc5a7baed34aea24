"""Why a group's pods do not start, read from pods as the API server returns them (the
kubernetes client's own models, built from the JSON the kubelet and the scheduler write)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes

from capstan.operator import pod_problems


def _pod(name: str, status: dict[str, Any], deleting: bool = False) -> Any:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    raw = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}
    return kubernetes.client.ApiClient().deserialize(json.dumps(raw), "V1Pod", "application/json")


def _waiting(reason: str, message: str, **extra: Any) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "broker",
                "image": "local/none:1",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}},
                **extra,
            }
        ],
    }


def test_a_missing_image_is_named_with_the_kubelets_reason():
    pod = _pod(
        "g-1", _waiting("ErrImageNeverPull", 'Container image "local/none:1" is not present')
    )
    found = pod_problems.problems([pod])
    assert [(p.pod, p.reason) for p in found] == [("g-1", "ErrImageNeverPull")]
    reason, message = pod_problems.summary(found)
    assert reason == "ImageUnavailable"
    assert message == 'pod g-1: ErrImageNeverPull: Container image "local/none:1" is not present'


def test_a_failed_pull_whose_message_omits_the_image_is_given_its_name():
    refused = 'Error response from daemon: Get "https://r/v2/": proxyconnect tcp: refused'
    (found,) = pod_problems.problems([_pod("g-0", _waiting("ErrImagePull", refused))])
    assert found.describe() == f"pod g-0: ErrImagePull: image local/none:1: {refused}"


def test_an_unschedulable_pod_carries_the_schedulers_message():
    status = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient memory.",
            }
        ],
    }
    reason, message = pod_problems.summary(pod_problems.problems([_pod("g-2", status)]))
    assert reason == "Unschedulable"
    assert "Insufficient memory" in message and "g-2" in message


def test_a_crash_loop_says_how_the_container_last_ended():
    status = _waiting(
        "CrashLoopBackOff",
        "back-off 40s restarting failed container",
        lastState={"terminated": {"exitCode": 2, "reason": "Error"}},
    )
    reason, message = pod_problems.summary(pod_problems.problems([_pod("g-0", status)]))
    assert reason == "CrashLooping"
    assert "last exit code 2 (Error)" in message


def test_pods_starting_running_or_being_deleted_are_not_problems():
    creating = _pod("g-0", _waiting("ContainerCreating", ""))
    running = _pod("g-1", {"phase": "Running", "containerStatuses": []})
    deleting = _pod("g-2", _waiting("ImagePullBackOff", "no"), deleting=True)
    assert pod_problems.problems([creating, running, deleting]) == []


def test_several_stuck_pods_are_listed_in_name_order_and_the_first_names_the_reason():
    pods = [
        _pod("g-2", _waiting("ErrImagePull", "not found")),
        _pod("g-1", _waiting("CreateContainerConfigError", 'secret "x" not found')),
    ]
    found = pod_problems.problems(pods)
    assert [p.pod for p in found] == ["g-1", "g-2"]
    assert pod_problems.summary(found)[0] == "ContainerNotCreated"
