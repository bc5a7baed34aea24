"""Why a group's pods do not start, in the words of the kubelet and the scheduler.

A pod that waits for an image the node cannot get, that no node can take, or whose container
keeps crashing never turns Ready, and the controller never hears of its broker: without this
the group would say "waiting for the pods" for ever. The first such pod (by name) names the
condition's reason; the message carries each stuck pod's own reason and message.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

IMAGE_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "RegistryUnavailable",
    }
)
CREATE_REASONS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
CRASH_REASONS = frozenset({"CrashLoopBackOff"})

CONDITION_REASONS = {
    "image": "ImageUnavailable",
    "schedule": "Unschedulable",
    "create": "ContainerNotCreated",
    "crash": "CrashLooping",
}


@dataclass(frozen=True)
class PodProblem:
    pod: str
    kind: str
    """One of CONDITION_REASONS' keys."""
    reason: str
    """The kubelet's or the scheduler's own reason, e.g. ErrImageNeverPull."""
    message: str

    def describe(self) -> str:
        return f"pod {self.pod}: {self.reason}: {self.message}".rstrip(": ")


def _kind_of(reason: str) -> str | None:
    if reason in IMAGE_REASONS:
        return "image"
    if reason in CREATE_REASONS:
        return "create"
    if reason in CRASH_REASONS:
        return "crash"
    return None


def problem_of(pod: Any) -> PodProblem | None:
    """What keeps one pod (a kubernetes client V1Pod) from running, if anything does."""
    name = pod.metadata.name
    status = pod.status
    if status is None or pod.metadata.deletion_timestamp is not None:
        return None
    for cond in status.conditions or ():
        if (
            cond.type == "PodScheduled"
            and cond.status == "False"
            and cond.reason == "Unschedulable"
        ):
            return PodProblem(name, "schedule", "Unschedulable", (cond.message or "").strip())
    statuses = [*(status.init_container_statuses or ()), *(status.container_statuses or ())]
    for cs in statuses:
        waiting = cs.state.waiting if cs.state is not None else None
        if waiting is None or not waiting.reason:
            continue
        kind = _kind_of(waiting.reason)
        if kind is None:
            continue
        message = (waiting.message or "").strip()
        if kind == "image" and cs.image and cs.image not in message:
            # A failed pull's message is the runtime's (a registry, a proxy), not the image.
            message = f"image {cs.image}: {message}".rstrip(": ")
        last = cs.last_state.terminated if cs.last_state is not None else None
        if kind == "crash" and last is not None:
            message = f"{message}; last exit code {last.exit_code} ({last.reason or 'no reason'})"
        return PodProblem(name, kind, waiting.reason, message)
    return None


def problems(pods: Iterable[Any]) -> list[PodProblem]:
    found = [p for p in (problem_of(pod) for pod in pods) if p is not None]
    return sorted(found, key=lambda p: p.pod)


def summary(found: list[PodProblem]) -> tuple[str, str]:
    """The condition's reason and message for `found` (not empty)."""
    reason = CONDITION_REASONS[found[0].kind]
    return reason, "; ".join(p.describe() for p in found)
