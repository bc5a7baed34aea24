"""ConsumerGroup handlers: a group's FIFO setting and retry policy are written to each
named BrokerGroup's brokers, and its lag per topic, summed over them, goes into the status.
A name of a BrokerGroup that does not exist sets Degraded, naming the field. A deleted
ConsumerGroup is deleted from its BrokerGroups (its subscription, offsets and retry
settings) unless it carries capstan.io/keep-on-delete: "true"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from capstan.client.errors import ClientError
from capstan.operator import conditions
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.group_fanout import remove_from_groups
from capstan.operator.operator_context import (
    API_GROUP,
    API_VERSION,
    RETRY_S,
    OperatorContext,
    missing_groups_conditions,
    status_conditions,
)
from capstan.operator.status_writer import own_status
from capstan.operator.stoppable_timers import unless_stopped

SYNC_INTERVAL_S = 10.0
KEEP_ANNOTATION = "capstan.io/keep-on-delete"
"""On a ConsumerGroup, "true": its deletion leaves the group on the brokers."""


def register(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    @kopf.on.resume(API_GROUP, API_VERSION, "consumergroups", registry=registry, backoff=RETRY_S)
    @kopf.on.create(API_GROUP, API_VERSION, "consumergroups", registry=registry, backoff=RETRY_S)
    @kopf.on.update(
        API_GROUP, API_VERSION, "consumergroups", field="spec", registry=registry, backoff=RETRY_S
    )
    @kopf.timer(
        API_GROUP, API_VERSION, "consumergroups", interval=SYNC_INTERVAL_S, registry=registry
    )
    async def sync_consumer_group(
        body: kopf.Body, status: kopf.Status, stopped: Any = None, **_: Any
    ) -> None:
        if body.get("metadata", {}).get("deletionTimestamp"):
            return
        await unless_stopped(_sync_consumer_group_once(body, status), stopped)

    async def _sync_consumer_group_once(body: kopf.Body, status: kopf.Status) -> None:
        async with ctx.one_at_a_time("ConsumerGroup", body):
            with ctx.metrics.reconcile("ConsumerGroup"):
                async with own_status(ctx.kube, "consumergroups", body) as patch:
                    await _sync_group(ctx, dict(body), status, patch)

    @kopf.on.delete(API_GROUP, API_VERSION, "consumergroups", registry=registry, backoff=RETRY_S)
    async def delete_consumer_group(body: kopf.Body, runtime: Any, **_: Any) -> None:
        meta, spec = body["metadata"], body.get("spec") or {}
        if (meta.get("annotations") or {}).get(KEEP_ANNOTATION) == "true":
            return
        name = spec.get("groupName") or meta["name"]

        async def remove(admin: BrokerGroupAdmin) -> object:
            return await admin.delete_group(name)

        with ctx.metrics.reconcile("ConsumerGroup"):
            await remove_from_groups(
                ctx, dict(body), f"consumer group {name}", remove, runtime.total_seconds()
            )


async def _sync_group(
    ctx: OperatorContext, body: dict[str, Any], status: Mapping[str, Any], patch: kopf.Patch
) -> None:
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, generation = meta["namespace"], int(meta.get("generation", 0))
    group_name = spec.get("groupName") or meta["name"]
    patch.status["groupName"] = group_name
    patch.status["observedGeneration"] = generation
    wanted = list(spec.get("brokerGroups") or [])
    missing = await ctx.missing_broker_groups(namespace, wanted)
    if missing:
        patch.status["conditions"] = missing_groups_conditions(status, missing, generation)
        return
    lag: dict[str, int] = {}
    problems = []
    max_attempts = int((spec.get("retry") or {}).get("maxAttempts", 17))
    for group in wanted:
        try:
            admin = await ctx.admin(namespace, group, await ctx.master_of(namespace, group))
            found = await admin.put_group(
                group_name, bool(spec.get("fifo", False)), max_attempts, create=True
            )
        except ClientError as exc:
            problems.append(f"{group}: {exc}")
            continue
        for topic, n in found.items():
            lag[topic] = lag.get(topic, 0) + n
    patch.status["topics"] = [{"topic": t, "lag": n} for t, n in sorted(lag.items())]
    patch.status["totalLag"] = sum(lag.values())
    if problems:
        patch.status["conditions"] = status_conditions(
            status,
            conditions.progressing("BrokerGroupUnreachable", "; ".join(problems)),
            generation,
        )
        raise kopf.TemporaryError("; ".join(problems), delay=10)
    patch.status["conditions"] = status_conditions(
        status, conditions.ready(f"group {group_name} on {', '.join(wanted)}"), generation
    )
