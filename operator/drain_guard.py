"""Evictions of broker pods (`kubectl drain`, a cluster autoscaler) that keep the
SyncStateSet.

The PodDisruptionBudget counts Ready pods, and a Ready slave may lag behind the master.
The operator's webhook sees every pod eviction and refuses, with 429 Too Many Requests
(which `kubectl drain` retries every 5 s), one that would
- take the master of a group of several replicas before it has handed over, or
- leave the SyncStateSet with fewer than minInSyncReplicas brokers.

A refused pod is handed to the roller (the capstan.io/manual-rolling-update annotation): it
moves the master off it, or waits until the SyncStateSet can spare it, then restarts it.
The drain's next try then meets the pod gone, or its successor, which holds nothing the
group counts on, and finishes. Evictions of other pods pass at once; while the controller
cannot be asked, a broker pod's eviction is refused (the drain retries).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from capstan.client.errors import ClientError
from capstan.operator import group_leadership, group_status
from capstan.operator.manifests import names
from capstan.operator.manifests.broker_group import COMPONENT
from capstan.operator.operator_context import OperatorContext
from capstan.operator.roller import GroupView

log = logging.getLogger(__name__)

PLURAL = "brokergroups"
CHECK_S = 8.0
"""How long the webhook waits for the controller's view before refusing for now."""


def eviction_refusal(pod: str, group: GroupView, replicas: int, min_in_sync: int) -> str | None:
    """Why evicting `pod` now would hurt its group, or None. Pure."""
    if group.master is None or replicas <= 1:
        # Nothing leads, so no write is acknowledged that an eviction could cost; or the
        # only replica, which has no one to hand over to (its PDB lets it go, too).
        return None
    if pod == group.master:
        return (
            f"{pod} is the master of its group and has not handed over; the operator moves "
            "the master off it, then restarts it"
        )
    if pod in group.sync_state_set:
        remaining = len(group.sync_state_set - {pod})
        if remaining < min_in_sync:
            return (
                f"evicting {pod} would leave {remaining} of min {min_in_sync} brokers in sync; "
                "the operator restarts it once the SyncStateSet can spare it"
            )
    return None


async def judge(ctx: OperatorContext, namespace: str, pod_name: str, dry_run: bool) -> str | None:
    """Why the eviction of `pod_name` is refused, or None to let it through. A refused pod
    is handed to the roller unless the eviction is a dry run."""
    pod = await ctx.kube.get("v1", "Pod", namespace, pod_name)
    if pod is None:
        return None
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    group_name = labels.get("app.kubernetes.io/instance", "")
    if meta.get("deletionTimestamp") or not (
        names.selector_labels(group_name, COMPONENT).items() <= labels.items()
    ):
        return None  # not a broker pod, or going already
    body = await ctx.kube.get_custom(PLURAL, namespace, group_name)
    if body is None:
        return None
    spec = body.get("spec") or {}
    pods = await ctx.kube.pods(namespace, names.selector_labels(group_name, COMPONENT))
    try:
        controller = await ctx.controller(namespace)
        info = await asyncio.wait_for(group_leadership.replicas(controller, group_name), CHECK_S)
    except (ClientError, TimeoutError) as exc:
        return (
            f"cannot ask the controller whether evicting {pod_name} keeps the SyncStateSet of "
            f"{group_name} ({exc or 'no answer'}); try again"
        )
    if info is None:
        return None  # no broker registered: nothing in sync to keep
    view = group_status.report(info, [p.metadata.name for p in pods]).view
    refusal = eviction_refusal(
        pod_name, view, int(spec.get("replicas", 2)), int(spec.get("minInSyncReplicas", 1))
    )
    if refusal and not dry_run:
        await _hand_to_roller(ctx, pod_name, meta, refusal)
    return refusal


async def _hand_to_roller(ctx: OperatorContext, pod: str, meta: dict[str, Any], why: str) -> None:
    """Annotate the pod for the roller, whose MovingMaster and RestartingPod Events then
    tell the story (Kopf posts no Event from an admission call)."""
    if (meta.get("annotations") or {}).get(names.MANUAL_ROLL_ANNOTATION) == "true":
        return  # handed over at an earlier try
    namespace = meta["namespace"]
    await ctx.kube.annotate_pod(namespace, pod, {names.MANUAL_ROLL_ANNOTATION: "true"})
    log.info("%s/%s: eviction refused, handed to the roller: %s", namespace, pod, why)
