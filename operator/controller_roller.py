"""Restarting the namespace's controller replicas onto a new template (an upgraded
operator's image, a changed template), one at a time.

A controller replica is Ready only while it leads (its /readyz), so the StatefulSet's own
rolling update, which waits for each updated pod to turn Ready, would wait forever on the
first follower it replaced. Its update strategy is OnDelete instead, and the operator
restarts the replicas: outdated followers first, highest ordinal first, each once every
replica runs again; the leader last, once another replica runs the new revision, which then
takes the Lease within seconds. With one replica, that one (a gap no order avoids).

`next_restart` is pure; `roll_controllers` reads the pods and applies its answer.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capstan.operator import events
from capstan.operator.manifests import names
from capstan.operator.manifests.controller import COMPONENT
from capstan.operator.operator_context import OperatorContext

log = logging.getLogger(__name__)

REVISION_LABEL = "controller-revision-hash"


@dataclass(frozen=True)
class ControllerPod:
    name: str
    outdated: bool
    """Its revision is not the StatefulSet's update revision."""
    running: bool
    """Its container runs and has started, and the pod is not being deleted."""
    leading: bool
    """Ready: only the leader is."""


def next_restart(pods: Sequence[ControllerPod], replicas: int) -> str | None:
    """The pod to delete now, or None to wait (something is starting) or when all is new."""
    if len(pods) < replicas or not all(p.running for p in pods):
        return None
    outdated = [p for p in pods if p.outdated]
    followers = sorted((p.name for p in outdated if not p.leading), reverse=True)
    if followers:
        return followers[0]
    if outdated and (replicas == 1 or any(not p.outdated for p in pods)):
        return outdated[0].name
    return None


def controller_pod(pod: Any, update_revision: str) -> ControllerPod:
    meta, status = pod.metadata, pod.status
    statuses = (status.container_statuses if status else None) or []
    running = bool(
        not meta.deletion_timestamp
        and status is not None
        and status.phase == "Running"
        and statuses
        and all(s.state is not None and s.state.running is not None and s.started for s in statuses)
    )
    leading = any(
        c.type == "Ready" and c.status == "True" for c in (status.conditions or ()) if status
    )
    return ControllerPod(
        name=meta.name,
        outdated=(meta.labels or {}).get(REVISION_LABEL) != update_revision,
        running=running,
        leading=leading,
    )


async def roll_controllers(ctx: OperatorContext, group: Mapping[str, Any]) -> None:
    """One look at the controller replicas of `group`'s namespace, and at most one restart;
    told as an Event on the group. Groups of one namespace share the lock."""
    namespace = group["metadata"]["namespace"]
    key = {"metadata": {"namespace": namespace, "name": names.CONTROLLER}}
    async with ctx.one_at_a_time("ControllerRoll", key):
        sts = await ctx.kube.get("apps/v1", "StatefulSet", namespace, names.CONTROLLER)
        if sts is None:
            return
        update_revision = (sts.get("status") or {}).get("updateRevision")
        if not update_revision:
            return
        replicas = int((sts.get("spec") or {}).get("replicas", 1))
        pods = await ctx.kube.pods(namespace, names.selector_labels(names.CONTROLLER, COMPONENT))
        views = [controller_pod(p, update_revision) for p in pods]
        doomed = next_restart(views, replicas)
        if doomed is None:
            return
        was = next(v for v in views if v.name == doomed)
        role = "the leading controller" if was.leading else "controller follower"
        log.info("%s: restarting %s %s onto revision %s", namespace, role, doomed, update_revision)
        events.done(
            group, "RestartingController", f"{doomed}: restarting {role} for its new revision"
        )
        await ctx.kube.delete_pod(namespace, doomed)
