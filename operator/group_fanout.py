"""Removing what a resource put on each BrokerGroup it names (a topic, a consumer group),
when the resource is deleted: a BrokerGroup that no longer exists took it along, and so do
all of them in a namespace being deleted (their brokers are stopping as the finalizer runs);
one that cannot be reached is tried again for DELETE_TIMEOUT_S, after which the resource goes
and a warning says what may be left, so a namespace's deletion never hangs on a dead group."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import kopf

from capstan.client.errors import ClientError
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.operator_context import OperatorContext

log = logging.getLogger(__name__)

DELETE_TIMEOUT_S = 120.0


async def remove_from_groups(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    what: str,
    remove: Callable[[BrokerGroupAdmin], Awaitable[object]],
    waited_s: float,
) -> None:
    """`remove` on the master of each BrokerGroup in the resource's spec.brokerGroups;
    `what` names the thing removed in errors and warnings ("topic Orders")."""
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    wanted = list(spec.get("brokerGroups") or [])
    missing = {
        g for _, g in await ctx.missing_broker_groups(namespace, wanted, all_when_terminating=True)
    }
    failed = []
    for group in wanted:
        if group in missing:
            continue  # the group is gone, and what it held with it
        try:
            await remove(await ctx.admin(namespace, group, await ctx.master_of(namespace, group)))
        except ClientError as exc:
            failed.append(f"{group}: {exc}")
    if failed and waited_s < DELETE_TIMEOUT_S:
        raise kopf.TemporaryError(f"deleting {what}: {'; '.join(failed)}", delay=10)
    if failed:
        log.warning(
            "%s/%s: gave up deleting %s after %.0f s (%s); the resource goes, and it may stay "
            "on those groups",
            namespace,
            meta["name"],
            what,
            waited_s,
            "; ".join(failed),
        )
