"""The Normal Events the operator posts on a resource for what it does to it (a roll step,
a scale step, a master move, a claim grown, a job scheduled), so `kubectl describe` and
`kubectl get events` tell the story; warnings come from Kopf's log posting."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf


def done(resource: Mapping[str, Any], reason: str, message: str) -> None:
    """A Normal Event on `resource` (its body: apiVersion, kind and metadata). Posted
    whatever Kopf's posting level (which keeps its own log lines to warnings)."""
    kopf.event(dict(resource), type="Normal", reason=reason, message=message)  # type: ignore[arg-type]


def scheduled(
    resource: Mapping[str, Any],
    reason: str,
    cronjob: Mapping[str, Any],
    does: str,
    before: Mapping[str, Any] | None,
) -> None:
    """The Event for a CronJob applied for `resource`, "the CronJob X `does` at SCHEDULE",
    when it is new or its schedule changed (`before`: the CronJob as it was, None when
    there was none): a handler retried every few seconds posts nothing new."""
    name, schedule = cronjob["metadata"]["name"], cronjob["spec"]["schedule"]
    if before is not None and (before.get("spec") or {}).get("schedule") == schedule:
        return
    done(resource, reason, f"the CronJob {name} {does} at {schedule}")
