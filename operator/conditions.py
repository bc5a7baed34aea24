"""Status conditions shaped like Kubernetes' metav1.Condition.

Each resource carries Ready, Progressing and Degraded, each True, False or Unknown with a
CamelCase reason and a message a person can act on. `lastTransitionTime` moves only when a
condition's status changes, so `kubectl describe` shows how long a state has held; a new
reason or message alone does not reset it.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TYPES = ("Ready", "Progressing", "Degraded")


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None
    """True, False, or None for Unknown."""
    reason: str
    message: str = ""


def _status_text(status: bool | None) -> str:
    return "Unknown" if status is None else "True" if status else "False"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merged(
    previous: Sequence[Mapping[str, Any]],
    changes: Sequence[Condition],
    generation: int,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """The conditions list after `changes`, in TYPES order then any others, keeping each
    unchanged condition's lastTransitionTime."""
    at = now or _now()
    by_type = {str(c.get("type")): dict(c) for c in previous}
    for change in changes:
        if not change.reason or not change.reason[0].isupper() or not change.reason.isalnum():
            raise ValueError(f"condition reason {change.reason!r} must be CamelCase")
        old = by_type.get(change.type)
        status = _status_text(change.status)
        kept = None if old is None or old.get("status") != status else old
        by_type[change.type] = {
            "type": change.type,
            "status": status,
            "observedGeneration": generation,
            "lastTransitionTime": at if kept is None else kept.get("lastTransitionTime", at),
            "reason": change.reason,
            "message": change.message,
        }
    order = [t for t in TYPES if t in by_type] + sorted(t for t in by_type if t not in TYPES)
    return [by_type[t] for t in order]


def ready(message: str) -> list[Condition]:
    return [
        Condition("Ready", True, "Ready", message),
        Condition("Progressing", False, "Settled", "no change in progress"),
        Condition("Degraded", False, "Healthy", "nothing is wrong"),
    ]


def progressing(reason: str, message: str, still_ready: bool = False) -> list[Condition]:
    """A change under way; `still_ready` when what runs keeps serving meanwhile (Ready
    stays True, with its reason "Ready")."""
    return [
        Condition("Ready", still_ready, "Ready" if still_ready else reason, message),
        Condition("Progressing", True, reason, message),
        Condition("Degraded", False, "Healthy", "nothing is wrong"),
    ]


def unobserved(reason: str, message: str) -> list[Condition]:
    """What runs could not be asked (its controller did not answer): whether it is ready or
    degraded is Unknown, and the operator keeps trying."""
    return [
        Condition("Ready", None, reason, message),
        Condition("Progressing", True, reason, message),
        Condition("Degraded", None, reason, message),
    ]


def degraded(reason: str, message: str, still_ready: bool | None = False) -> list[Condition]:
    """A change the operator refuses or cannot make; `still_ready` says whether what runs
    keeps serving meanwhile."""
    return [
        Condition("Ready", still_ready, reason if not still_ready else "Ready", message),
        Condition("Progressing", False, reason, message),
        Condition("Degraded", True, reason, message),
    ]
