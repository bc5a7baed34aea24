"""Topic handlers: the resource is written to each named BrokerGroup
through its admin API, and a timer finds and repairs drift (one-way sync: the resource
wins). A name of a BrokerGroup that does not exist sets Degraded, naming the field, and
nothing is written anywhere. A Topic's finalizer deletes it from its groups
(group_fanout.py, which gives up on groups that cannot be reached after a while)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import kopf

from capstan.client.errors import ClientError
from capstan.common.queue_mapping import QueueMapping
from capstan.operator import conditions, events, resource_rules
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.group_fanout import DELETE_TIMEOUT_S, remove_from_groups
from capstan.operator.manifests import spark_jobs
from capstan.operator.operator_context import (
    API_GROUP,
    API_VERSION,
    RETRY_S,
    OperatorContext,
    missing_groups_conditions,
    status_conditions,
)
from capstan.operator.static_topic_sync import (
    StaticAction,
    StaticStep,
    mapping_status,
    repair_static_settings,
    sync_static_round,
)
from capstan.operator.status_writer import own_status
from capstan.operator.stoppable_timers import unless_stopped
from capstan.operator.topic_sync import TopicAction, TopicShape, next_topic_step

log = logging.getLogger(__name__)

SYNC_INTERVAL_S = 10.0
MOVES_PER_ROUND_S = 20.0
"""How long one round of a static topic's sync goes on moving logic queues."""
REMAP_AGAIN_S = 2.0
"""When the next round comes while moves remain (or a move is being finished)."""
_PHASES = {"write-queues": "ShrinkingWriteQueues", "read-queues": "ShrinkingReadQueues"}


def register(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    @kopf.on.resume(API_GROUP, API_VERSION, "topics", registry=registry, backoff=RETRY_S)
    @kopf.on.create(API_GROUP, API_VERSION, "topics", registry=registry, backoff=RETRY_S)
    @kopf.on.update(
        API_GROUP, API_VERSION, "topics", field="spec", registry=registry, backoff=RETRY_S
    )
    @kopf.timer(
        API_GROUP,
        API_VERSION,
        "topics",
        interval=SYNC_INTERVAL_S,
        registry=registry,
        backoff=RETRY_S,
    )
    async def sync_topic(
        body: kopf.Body, status: kopf.Status, stopped: Any = None, **_: Any
    ) -> None:
        if body.get("metadata", {}).get("deletionTimestamp"):
            return
        await unless_stopped(_sync_topic_once(body, status), stopped)

    async def _sync_topic_once(body: kopf.Body, status: kopf.Status) -> None:
        async with ctx.one_at_a_time("Topic", body):
            with ctx.metrics.reconcile("Topic"):
                async with own_status(ctx.kube, "topics", body) as patch:
                    await _sync_topic(ctx, dict(body), status, patch)

    @kopf.on.delete(API_GROUP, API_VERSION, "topics", registry=registry, backoff=RETRY_S)
    async def delete_topic(body: kopf.Body, runtime: Any, **_: Any) -> None:
        with ctx.metrics.reconcile("Topic"):
            await _delete_topic(ctx, dict(body), runtime.total_seconds())


def desired_shape(spec: Mapping[str, Any]) -> TopicShape:
    queues = int(spec.get("queues", 8))
    perm = (4 if spec.get("readable", True) else 0) | (2 if spec.get("writable", True) else 0)
    attributes = {str(k): str(v) for k, v in (spec.get("attributes") or {}).items()}
    if spec.get("cleanupPolicy", "delete") != "delete":
        attributes["cleanup.policy"] = str(spec["cleanupPolicy"]).upper()
    return TopicShape(
        read_queues=int(spec.get("readQueues", queues)),
        write_queues=queues,
        perm=perm,
        message_type=str(spec.get("messageType", "NORMAL")),
        attributes=attributes,
    )


async def _sync_topic(
    ctx: OperatorContext, body: dict[str, Any], status: Mapping[str, Any], patch: kopf.Patch
) -> None:
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, generation = meta["namespace"], int(meta.get("generation", 0))
    topic = spec.get("topicName") or meta["name"]
    patch.status["topicName"] = topic
    patch.status["observedGeneration"] = generation
    errors = resource_rules.topic_errors(spec)
    wanted = list(spec.get("brokerGroups") or [])
    missing = await ctx.missing_broker_groups(namespace, wanted)
    if errors or missing:
        patch.status["phase"] = "Failed"
        patch.status["conditions"] = (
            missing_groups_conditions(status, missing, generation)
            if missing
            else status_conditions(
                status,
                conditions.degraded("InvalidSpec", "; ".join(map(str, errors))),
                generation,
            )
        )
        return
    if spec.get("static"):
        await _sync_static_topic(ctx, body, topic, wanted, status, patch)
        return
    desired = desired_shape(spec)
    per_group = []
    phases = set()
    problems = []
    for group in wanted:
        admin = await ctx.admin(namespace, group, await ctx.master_of(namespace, group))
        entry: dict[str, Any] = {"name": group}
        try:
            found = await admin.topic(topic)
            actual, ends = found if found is not None else (None, {})
            committed = await admin.committed(topic) if found is not None else {}
            step = next_topic_step(desired, actual, ends, committed)
            if step.action in (TopicAction.CREATE, TopicAction.UPDATE):
                assert step.shape is not None
                await admin.put_topic(topic, step.shape, create=step.action is TopicAction.CREATE)
                shown = step.shape
            else:
                shown = actual or desired
            phase = _PHASES.get(step.phase, "InSync" if step.action is TopicAction.IN_SYNC else "")
            phase = phase or ("Creating" if step.action is TopicAction.CREATE else "InSync")
            entry.update(
                readQueues=shown.read_queues,
                writeQueues=shown.write_queues,
                phase=phase,
                drift=list(step.drift),
                message=step.reason,
            )
            phases.add(phase)
        except ClientError as exc:
            entry.update(phase="Waiting", message=str(exc))
            problems.append(f"{group}: {exc}")
            phases.add("Waiting")
        per_group.append(entry)
    patch.status["brokerGroups"] = per_group
    await _schedule_compaction(ctx, body)
    shrinking = sorted(p for p in phases if p.startswith("Shrinking"))
    if problems:
        patch.status["phase"] = "Waiting"
        changes = conditions.progressing("BrokerGroupUnreachable", "; ".join(problems))
    elif shrinking:
        patch.status["phase"] = shrinking[-1]
        messages = "; ".join(f"{e['name']}: {e['message']}" for e in per_group)
        changes = conditions.progressing(shrinking[-1], messages)
    else:
        patch.status["phase"] = "InSync"
        changes = conditions.ready(f"topic {topic} on {', '.join(wanted)}")
    patch.status["conditions"] = status_conditions(status, changes, generation)
    if problems:
        raise kopf.TemporaryError("; ".join(problems), delay=10)


async def _sync_static_topic(
    ctx: OperatorContext,
    body: dict[str, Any],
    topic: str,
    groups: list[str],
    status: Mapping[str, Any],
    patch: kopf.Patch,
) -> None:
    """A static topic, through the controllers: made, then its logic queues moved one at a
    time until their writes are spread over `groups` (static_topic_sync.py), each move
    shown in the status and posted as an Event. Moves go on for up to MOVES_PER_ROUND_S,
    then the next round (a few seconds later) carries on. A group left out of the resource
    is drained of writes; once its BrokerGroup is deleted too (which the operator allows
    only when nothing of it is left unconsumed), it is retired from the mapping. Once in
    step, settings changed on a group are put back (the status names the drifted fields),
    and a compact topic gets its compaction CronJob as a normal one does."""
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, generation = meta["namespace"], int(meta.get("generation", 0))
    queues = int(spec.get("queues", 8))

    async def done(reason: str, message: str, now: QueueMapping, next_step: StaticStep) -> None:
        events.done(body, reason, message)
        status_now = {"static": mapping_status(now, next_step.remaining)}
        await ctx.kube.patch_custom_status("topics", namespace, meta["name"], status_now)

    await _schedule_compaction(ctx, body)  # whether or not the controllers answer
    drift: dict[str, tuple[str, ...]] = {}
    try:
        admin = await ctx.controller_admin(namespace)
        shape = desired_shape(spec)
        mapping, step = await sync_static_round(
            admin, topic, queues, shape, groups, done, MOVES_PER_ROUND_S
        )
        if mapping is not None and step.action is StaticAction.IN_SYNC:
            # A group left out of the resource and deleted since: its items go too.
            leftover = [g for g in mapping.groups() if g not in groups]
            for _, gone in await ctx.missing_broker_groups(namespace, leftover):
                mapping = await admin.retire(topic, gone)
                message = f"group {gone} is gone: static topic {topic} no longer reads from it"
                await done("BrokerGroupRetired", message, mapping, step)
            # Settings changed on a group by hand (or in the resource) are put back.
            admins = {
                g: await ctx.admin(namespace, g, await ctx.master_of(namespace, g))
                for g in mapping.groups()
            }
            drift = await repair_static_settings(admins, topic, shape)
    except ClientError as exc:
        patch.status["phase"] = "Waiting"
        changes = conditions.progressing("ControllerUnreachable", str(exc))
        patch.status["conditions"] = status_conditions(status, changes, generation)
        raise kopf.TemporaryError(str(exc), delay=RETRY_S) from exc
    if mapping is not None:
        patch.status["static"] = mapping_status(mapping, step.remaining)
        patch.status["brokerGroups"] = [
            {
                "name": g,
                "writeQueues": len(mapping.led_by(g)),
                "readQueues": len(mapping.hosted_by(g)),
                "phase": (
                    "Drained"
                    if g not in groups
                    else "InSync"
                    if step.action is StaticAction.IN_SYNC
                    else "Remapping"
                ),
                "drift": list(drift.get(g, ())),
            }
            for g in mapping.groups()
        ]
    if step.action is StaticAction.REFUSE:
        patch.status["phase"] = "Failed"
        changes = conditions.degraded("InvalidSpec", step.reason)
    elif step.action is StaticAction.IN_SYNC:
        patch.status["phase"] = "InSync"
        changes = conditions.ready(f"static topic {topic}: {step.reason}")
    else:
        patch.status["phase"] = "Remapping"
        changes = conditions.progressing("Remapping", step.reason)
    patch.status["conditions"] = status_conditions(status, changes, generation)
    if step.action in (StaticAction.MOVE, StaticAction.WAIT):
        raise kopf.TemporaryError(step.reason, delay=REMAP_AGAIN_S)


async def _schedule_compaction(ctx: OperatorContext, body: dict[str, Any]) -> None:
    """A compact topic gets its compaction CronJob; any other has none."""
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    api = spark_jobs.cronjob_api(ctx.facts)
    if spec.get("cleanupPolicy", "delete") != "compact":
        await ctx.kube.delete(api, "CronJob", namespace, spark_jobs.compaction_name(meta["name"]))
        return
    owners = await ctx.job_account_owners(namespace)
    for obj in spark_jobs.job_account(namespace, owners):
        await ctx.kube.apply(obj)
    cronjob = spark_jobs.compaction_cronjob(
        body, ctx.facts, ctx.spark_image, ctx.secure, ctx.controller_replicas
    )
    before = await ctx.kube.get(api, "CronJob", namespace, cronjob["metadata"]["name"])
    await ctx.kube.apply(cronjob)
    events.scheduled(body, "CompactionScheduled", cronjob, "compacts", before)


async def _delete_topic(ctx: OperatorContext, body: dict[str, Any], waited_s: float) -> None:
    spec = body.get("spec") or {}
    topic = spec.get("topicName") or body["metadata"]["name"]
    if spec.get("static"):
        await _delete_static_topic(ctx, body, topic, waited_s)
        return

    async def remove(admin: BrokerGroupAdmin) -> object:
        return await admin.delete_topic(topic)

    await remove_from_groups(ctx, body, f"topic {topic}", remove, waited_s)


async def _delete_static_topic(
    ctx: OperatorContext, body: dict[str, Any], topic: str, waited_s: float
) -> None:
    """The controllers delete a static topic from its groups and their book. When every
    group it names is gone, so is the topic; controllers that cannot be reached are tried
    for DELETE_TIMEOUT_S, then the resource goes with a warning (a namespace's deletion
    never hangs on them)."""
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    wanted = list(spec.get("brokerGroups") or [])
    if len(await ctx.missing_broker_groups(namespace, wanted, all_when_terminating=True)) == len(
        wanted
    ):
        return
    try:
        await (await ctx.controller_admin(namespace)).delete_topic(topic)
    except ClientError as exc:
        if waited_s < DELETE_TIMEOUT_S:
            raise kopf.TemporaryError(f"deleting static topic {topic}: {exc}", delay=10) from exc
        log.warning(
            "%s/%s: gave up deleting static topic %s after %.0f s (%s); the resource goes, "
            "and the topic may stay on its groups",
            namespace,
            meta["name"],
            topic,
            waited_s,
            exc,
        )
