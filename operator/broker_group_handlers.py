"""BrokerGroup handlers: apply the children the manifests build, then observe the group
and carry out the roller's and the scale-down's steps, one per round.

On create, update and resume the children are applied (a spec that breaks a rule sets
Degraded, naming the field, and creates nothing). A timer then, every few seconds, reads
the pods, the StatefulSet and the controller's view of the group, writes the status
(master, epoch, SyncStateSet, per-replica lag, conditions), and takes one step: restart an
outdated pod, move the master, or shrink the StatefulSet, as operator/roller.py and
operator/scaling.py decide.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import kopf
from kubernetes.client import ApiException

from capstan.client.errors import ClientError
from capstan.operator import (
    cluster_security,
    conditions,
    events,
    group_leadership,
    group_status,
    image_default,
    pod_problems,
    rack,
    resource_rules,
    storage_growth,
)
from capstan.operator.controller_roller import roll_controllers
from capstan.operator.kube_objects import refusal_message
from capstan.operator.listener_status import listener_status
from capstan.operator.manifests import controller as controller_manifests
from capstan.operator.manifests import names, spark_jobs
from capstan.operator.manifests.broker_group import COMPONENT, BrokerGroupManifests
from capstan.operator.manifests.cluster import owner_reference
from capstan.operator.manifests.controller import ControllerManifests
from capstan.operator.operator_context import (
    API_GROUP,
    API_VERSION,
    RETRY_S,
    OperatorContext,
    status_conditions,
)
from capstan.operator.quantity import size_in_bytes
from capstan.operator.roller import Action, PodView, Step, next_step, stuck_step
from capstan.operator.scaling import Refusal, scale_down_step
from capstan.operator.status_writer import own_status
from capstan.operator.stoppable_timers import unless_stopped

log = logging.getLogger(__name__)

PLURAL = "brokergroups"
REMAKE_WAIT_S = 30.0
"""How long an orphaning deletion of the StatefulSet may take before it is retried."""
OBSERVE_INTERVAL_S = 3.0
OBSERVE_TIMEOUT_S = 90.0
"""Longer than any one call may take (the API server's 30 s, the controller's 10 s) and a
few of them in a row."""


def register(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    @kopf.on.resume(API_GROUP, API_VERSION, PLURAL, registry=registry, backoff=RETRY_S)
    @kopf.on.create(API_GROUP, API_VERSION, PLURAL, registry=registry, backoff=RETRY_S)
    @kopf.on.update(
        API_GROUP, API_VERSION, PLURAL, field="spec", registry=registry, backoff=RETRY_S
    )
    async def apply_children(
        body: kopf.Body, status: kopf.Status, patch: kopf.Patch, **_: Any
    ) -> None:
        with ctx.metrics.reconcile("BrokerGroup"), _certificates_awaited():
            try:
                group = _moved_onto_the_default_image(dict(body), patch)
                await _apply_children(ctx, group, status, patch)
            except cluster_security.CertificatesUnavailable as exc:
                # Said in the status: a group waiting on its certificates makes nothing yet.
                generation = int(body["metadata"].get("generation", 0))
                if isinstance(exc, cluster_security.CertificatesPending):
                    changes = conditions.progressing(exc.reason, str(exc))
                else:
                    changes = conditions.degraded(exc.reason, str(exc), still_ready=None)
                patch.status["conditions"] = status_conditions(status, changes, generation)
                raise

    @kopf.on.delete(API_GROUP, API_VERSION, PLURAL, registry=registry, backoff=RETRY_S)
    async def delete_claims(body: kopf.Body, **_: Any) -> None:
        """spec.storage.deleteClaim: the claims (and the data) go with the group; they are
        removed once its pods are (the claims' protection waits for them)."""
        storage = (body.get("spec") or {}).get("storage") or {}
        if not storage.get("deleteClaim"):
            return
        meta = body["metadata"]
        selector = names.selector_labels(meta["name"], COMPONENT)
        for claim in await ctx.kube.claims(meta["namespace"], selector):
            log.info(
                "%s/%s: deleting the claim %s", meta["namespace"], meta["name"], claim.metadata.name
            )
            await ctx.kube.delete_claim(meta["namespace"], claim.metadata.name)

    @kopf.timer(
        API_GROUP,
        API_VERSION,
        PLURAL,
        interval=OBSERVE_INTERVAL_S,
        registry=registry,
        backoff=RETRY_S,
    )
    async def observe(body: kopf.Body, status: kopf.Status, stopped: Any = None, **_: Any) -> None:
        meta = body.get("metadata", {})
        if meta.get("deletionTimestamp"):
            return
        await unless_stopped(_observe_once(body, status), stopped)

    async def _observe_once(body: kopf.Body, status: kopf.Status) -> None:
        with ctx.metrics.reconcile("BrokerGroup"):
            doing = ["starting"]
            async with own_status(ctx.kube, PLURAL, body) as patch:
                task = asyncio.ensure_future(_observe(ctx, dict(body), status, patch, doing))
                # asyncio.wait, not wait_for: a call that neither answers nor lets itself be
                # cancelled must not freeze the group's status for good.
                done, _still = await asyncio.wait({task}, timeout=OBSERVE_TIMEOUT_S)
                if not done:
                    task.cancel()
                    raise kopf.TemporaryError(
                        f"observing the group took over {OBSERVE_TIMEOUT_S:.0f} s"
                        f" (stuck {doing[0]}); retrying",
                        delay=RETRY_S,
                    )
                task.result()

    @kopf.timer(
        API_GROUP,
        API_VERSION,
        PLURAL,
        id="renew_certificates",
        interval=cluster_security.RENEW_INTERVAL_S,
        initial_delay=cluster_security.RENEW_INTERVAL_S,
        registry=registry,
        backoff=RETRY_S,
    )
    async def renew_certificates(body: kopf.Body, **_: Any) -> None:
        """Certificates near their expiry (or the CA's) are issued again; the pods take up
        the new files without a restart."""
        meta = body.get("metadata", {})
        if ctx.security is None or meta.get("deletionTimestamp"):
            return
        with ctx.metrics.reconcile("BrokerGroup"), _certificates_awaited():
            # The secrets alone: the controller's other children change only with the groups.
            owners = await _group_owners(ctx, meta["namespace"])
            if owners:
                await ctx.security.ensure_namespace(meta["namespace"], owners)
            await _ensure_group_certificate(ctx, dict(body))
            problem = await ctx.security.certificate_problem(meta["namespace"], meta["name"])
            if problem:
                raise kopf.TemporaryError(problem, delay=cluster_security.RENEW_INTERVAL_S)


def _moved_onto_the_default_image(body: dict[str, Any], patch: kopf.Patch) -> dict[str, Any]:
    """The group as this reconcile builds it: a stored group holding the CRD's old default
    image loses spec.image (operator/image_default.py), here and in the patch."""
    move = image_default.image_move(body)
    if move.mark:
        patch.metadata.annotations[image_default.MIGRATED] = "checked"
    if not move.drop_image:
        return body
    meta = body["metadata"]
    log.warning("%s/%s: %s", meta["namespace"], meta["name"], move.message)
    events.done(body, reason="ImageFollowsOperator", message=move.message)
    patch.spec["image"] = None
    return {**body, "spec": {k: v for k, v in (body.get("spec") or {}).items() if k != "image"}}


def _manifests(ctx: OperatorContext, body: Mapping[str, Any]) -> BrokerGroupManifests:
    """What `body` becomes, as this operator builds it."""
    return BrokerGroupManifests(
        body,
        ctx.facts,
        ctx.controller_replicas,
        ctx.secure,
        ctx.operator_namespace,
        default_image=ctx.image,
    )


@contextlib.contextmanager
def _certificates_awaited() -> Iterator[None]:
    """Certificates that cannot be in place yet (cert-manager missing, or not done issuing)
    are retried after a while, with the reason in the resource's events, no traceback."""
    try:
        yield
    except cluster_security.CertificatesUnavailable as exc:
        raise kopf.TemporaryError(str(exc), delay=exc.retry_s) from None


async def _apply_children(
    ctx: OperatorContext, body: dict[str, Any], status: Mapping[str, Any], patch: kopf.Patch
) -> None:
    meta = body["metadata"]
    generation = int(meta.get("generation", 0))
    errors = resource_rules.broker_group_errors(body.get("spec") or {})
    if errors:
        message = "; ".join(str(e) for e in errors)
        patch.status["conditions"] = status_conditions(
            status, conditions.degraded("InvalidSpec", message, still_ready=None), generation
        )
        patch.status["observedGeneration"] = generation
        return
    await _apply_controller(ctx, meta["namespace"])
    await _ensure_group_certificate(ctx, body)
    m = _manifests(ctx, body)
    current = await ctx.kube.get("apps/v1", "StatefulSet", meta["namespace"], meta["name"])
    replicas = m.spec.replicas
    if current is not None:
        # Fewer replicas wait for the scale-down's steps (the timer shrinks the set).
        replicas = max(replicas, int(current["spec"]["replicas"]))
        if _claim_size(current) != size_in_bytes(m.spec.storage_size):
            await _remake_for_claims(ctx, meta["namespace"], meta["name"])
    for child in m.children(replicas):
        try:
            await ctx.kube.apply(child)
        except ApiException as exc:
            if exc.status not in (400, 422):
                raise
            # A template the API server refuses (a wrong toleration, say): nothing to retry
            # until the spec changes, so say it where the user looks.
            message = f"the API server refused the {child['kind']}: {refusal_message(exc)}"
            patch.status["conditions"] = status_conditions(
                status, conditions.degraded("Refused", message, still_ready=None), generation
            )
            patch.status["observedGeneration"] = generation
            return
    if current is not None and replicas > int(current["spec"]["replicas"]):
        before = int(current["spec"]["replicas"])
        events.done(body, reason="ScalingUp", message=f"from {before} to {replicas} replicas")
    if m.network_policy() is None:
        await ctx.kube.delete(
            "networking.k8s.io/v1", "NetworkPolicy", meta["namespace"], meta["name"]
        )
    await _remove_old_listeners(ctx, m)
    await _schedule_audit(ctx, body)
    patch.status["observedGeneration"] = generation
    # A group that serves stays Ready while its change is applied: the next look at its
    # pods (the timer) says whether a roll makes it otherwise.
    serving = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
    patch.status["conditions"] = status_conditions(
        status,
        conditions.progressing(
            "Applied", "children applied; waiting for the pods", still_ready=serving
        ),
        generation,
    )


async def _remove_old_listeners(ctx: OperatorContext, m: BrokerGroupManifests) -> None:
    """Delete the Services of listeners no longer in the spec."""
    wanted = {str(listener["name"]) for listener in m.spec.listeners}
    for service in await ctx.kube.services(m.namespace, names.selector_labels(m.name, COMPONENT)):
        listener = (service.metadata.labels or {}).get(names.LISTENER_LABEL)
        if listener is not None and listener not in wanted:
            log.info("%s/%s: removing the listener %s", m.namespace, m.name, listener)
            await ctx.kube.delete("v1", "Service", m.namespace, service.metadata.name)


def _claim_size(sts: Mapping[str, Any]) -> int:
    (template,) = sts["spec"]["volumeClaimTemplates"]
    return size_in_bytes(template["spec"]["resources"]["requests"]["storage"])


async def _remake_for_claims(ctx: OperatorContext, namespace: str, name: str) -> None:
    """A StatefulSet's claim template cannot change: delete the set leaving its pods (they
    run on, and the new set adopts them, same template, same revision), wait until it is
    gone, and let the caller apply it with the new size. The claims grow on their own
    (_grow_storage)."""
    log.info("%s/%s: making the StatefulSet again for the new claim size", namespace, name)
    await ctx.kube.delete("apps/v1", "StatefulSet", namespace, name, orphan=True)
    for _ in range(int(REMAKE_WAIT_S / 0.5)):
        if await ctx.kube.get("apps/v1", "StatefulSet", namespace, name) is None:
            return
        await asyncio.sleep(0.5)
    raise kopf.TemporaryError(
        f"the StatefulSet {name} was not gone within {REMAKE_WAIT_S:.0f} s of its deletion",
        delay=RETRY_S,
    )


async def _schedule_audit(ctx: OperatorContext, body: dict[str, Any]) -> None:
    """The group's audit CronJob while spec.audit.schedule is set; none otherwise."""
    meta = body["metadata"]
    api = spark_jobs.cronjob_api(ctx.facts)
    cronjob = spark_jobs.audit_cronjob(
        body, ctx.facts, ctx.spark_image, ctx.secure, ctx.controller_replicas
    )
    if cronjob is None:
        name = spark_jobs.audit_name(meta["name"])
        await ctx.kube.delete(api, "CronJob", meta["namespace"], name)
        return
    owners = await ctx.job_account_owners(meta["namespace"])
    for obj in spark_jobs.job_account(meta["namespace"], owners):
        await ctx.kube.apply(obj)
    before = await ctx.kube.get(api, "CronJob", meta["namespace"], cronjob["metadata"]["name"])
    await ctx.kube.apply(cronjob)
    events.scheduled(body, "AuditScheduled", cronjob, "audits", before)


async def _group_owners(ctx: OperatorContext, namespace: str) -> list[dict[str, Any]]:
    """ownerReferences to every BrokerGroup of `namespace` not being deleted: the owners of
    what the namespace's groups share (the controller, the CA and keys)."""
    groups = await ctx.kube.list_custom(PLURAL, namespace)
    return [
        owner_reference(g, controller=False)
        for g in groups
        if not g["metadata"].get("deletionTimestamp")
    ]


async def _ensure_group_certificate(ctx: OperatorContext, body: dict[str, Any]) -> None:
    """The group's server certificate, for its names and spec.tls.alternativeNames."""
    if ctx.security is None:
        return
    meta = body["metadata"]
    await ctx.security.ensure_group(
        meta["namespace"], meta["name"], owner_reference(body), None, _alternative_names(body)
    )


async def _apply_controller(ctx: OperatorContext, namespace: str) -> None:
    """The namespace's controller, owned by every BrokerGroup there."""
    owners = await _group_owners(ctx, namespace)
    if not owners:
        return
    if ctx.security is not None:
        await ctx.security.ensure_namespace(namespace, owners)
    built = ControllerManifests(
        namespace,
        owners,
        ctx.facts,
        ctx.image,
        ctx.controller_replicas,
        ctx.secure,
        ctx.operator_namespace,
        ctx.controller_template,
    )
    for child in built.children():
        await ctx.kube.apply(child)


async def _observe(
    ctx: OperatorContext,
    body: dict[str, Any],
    status: Mapping[str, Any],
    patch: kopf.Patch,
    doing: list[str],
) -> None:
    """One look at the group and one step of the roller; `doing[0]` says what it awaits."""
    meta, spec = body["metadata"], body.get("spec") or {}
    name, namespace = meta["name"], meta["namespace"]
    generation = int(meta.get("generation", 0))
    if resource_rules.broker_group_errors(spec):
        return  # Degraded already says why; nothing runs to observe
    doing[0] = "reading the StatefulSet"
    sts = await ctx.kube.get("apps/v1", "StatefulSet", namespace, name)
    if sts is None:
        return
    doing[0] = "restarting the namespace's controllers onto their new revision"
    await roll_controllers(ctx, body)
    doing[0] = "listing the pods"
    pods = await ctx.kube.pods(namespace, names.selector_labels(name, COMPONENT))
    if (meta.get("annotations") or {}).get(names.MANUAL_ROLL_ANNOTATION) == "true":
        doing[0] = "passing the manual rolling update on to the pods"
        pods = await _roll_by_hand(ctx, body, pods)
    rack_key = (spec.get("rack") or {}).get("topologyKey")
    if rack_key:
        doing[0] = "telling the pods their zones"
        await _tell_zones(ctx, namespace, pods, rack_key)
    stuck = pod_problems.problems(pods)
    stuck_names = {p.pod for p in stuck}
    views = [_pod_view(p, sts, p.metadata.name in stuck_names) for p in pods]
    ready = sum(1 for v in views if v.ready)
    desired = int(spec.get("replicas", 2))
    min_in_sync = int(spec.get("minInSyncReplicas", 1))
    patch.status["ready"] = f"{ready}/{desired}"
    patch.status["readyReplicas"] = ready
    if spec.get("listeners") or status.get("listeners"):
        doing[0] = "reading the listeners' Services"
        services = await ctx.kube.services(namespace, names.selector_labels(name, COMPONENT))
        patch.status["listeners"] = listener_status(
            name, namespace, spec.get("listeners") or (), services
        )
    doing[0] = "growing the claims"
    storage = await _grow_storage(ctx, body, patch)

    def set_conditions(changes: list[conditions.Condition]) -> None:
        # Pods that cannot start outrank what the roller or the controller would say: the
        # pod's own reason is what the user has to fix.
        if stuck:
            reason, message = pod_problems.summary(stuck)
            changes = conditions.degraded(reason, message, still_ready=False)
        else:
            changes = _with_storage(changes, storage)
        patch.status["conditions"] = status_conditions(status, changes, generation)

    fix = stuck_step(views)
    if fix is not None:
        log.info("%s/%s: %s", namespace, name, fix.reason)
        patch.status["rollout"] = fix.reason
        doing[0] = f"deleting the stuck pod {fix.pod}"
        await ctx.kube.delete_pod(namespace, fix.pod)
        set_conditions(conditions.progressing("Rolling", fix.reason))
        return
    try:
        doing[0] = "asking the controller for the group"
        info = await group_leadership.replicas(await ctx.controller(namespace), name)
    except ClientError as exc:
        if not stuck:
            doing[0] = "listing the controller's pods"
            controllers = await ctx.kube.pods(
                namespace,
                names.selector_labels(names.CONTROLLER, controller_manifests.COMPONENT),
            )
            stuck = pod_problems.problems(controllers)
        set_conditions(conditions.unobserved("ControllerUnreachable", f"{exc}; retrying"))
        return
    if info is None:
        patch.status["rollout"] = "waiting for the brokers to register with the controller"
        set_conditions(conditions.progressing("Starting", patch.status["rollout"]))
        return
    pod_names = [v.name for v in views]
    report = group_status.report(info, pod_names)
    patch.status.update(report.status)
    current = int(sts["spec"]["replicas"])
    step: Step | Refusal
    if desired < current:
        step = scale_down_step(views, desired, report.view, min_in_sync)
    else:
        step = next_step(views, report.view, min_in_sync)
    if isinstance(step, Refusal):
        patch.status["rollout"] = step.reason
        set_conditions(conditions.degraded("ScaleDownRefused", step.reason, still_ready=True))
        return
    patch.status["rollout"] = step.reason
    doing[0] = f"taking the step: {step.reason}"
    await _take(ctx, body, step, desired < current, info, pod_names)
    settled = step.action is Action.DONE and ready == desired == current
    if settled and report.view.master:
        changes = conditions.ready(
            f"{ready}/{desired} ready, master {report.view.master}, "
            f"{len(report.view.sync_state_set)} in sync"
        )
    elif report.view.master is None:
        changes = conditions.progressing("NoMaster", "the group has no master yet")
    else:
        reason = "ScalingDown" if desired < current else "Rolling"
        changes = conditions.progressing(reason, step.reason)
    set_conditions(changes)


async def _tell_zones(ctx: OperatorContext, namespace: str, pods: list[Any], key: str) -> None:
    """Annotate each newly scheduled pod with its node's zone (operator/rack.py)."""
    try:
        wanted = await rack.zones_to_set(pods, key, ctx.kube.node_labels)
    except ApiException as exc:
        if exc.status != 403:
            raise
        log.warning(
            "%s: may not read nodes (%s): the brokers' zones stay unknown", namespace, exc.reason
        )
        return
    for pod, zone in wanted.items():
        log.info("%s/%s: zone %s", namespace, pod, zone)
        await ctx.kube.annotate_pod(namespace, pod, {names.ZONE_ANNOTATION: zone})


async def _grow_storage(
    ctx: OperatorContext, body: dict[str, Any], patch: kopf.Patch
) -> storage_growth.StoragePlan:
    """Grow the group's bound claims to spec.storage.size where their class allows it, and
    report each claim in status.storage."""
    meta, spec = body["metadata"], body.get("spec") or {}
    name, namespace = meta["name"], meta["namespace"]
    size = str((spec.get("storage") or {}).get("size") or resource_rules.DEFAULT_STORAGE)
    try:
        pvcs = await ctx.kube.claims(namespace, names.selector_labels(name, COMPONENT))
        # The classes matter only to a claim that must grow: not read on every round.
        small = storage_growth.smaller_than(size, pvcs)
        classes = await ctx.kube.storage_classes() if small else []
        expandable, default_class = storage_growth.classes_of(classes)
    except ApiException as exc:
        if exc.status != 403:
            raise
        # An operator without the rights (a chart older than the operator): the group is
        # observed all the same, and the status says what it cannot see.
        patch.status["storage"] = {"size": size, "ready": False, "claims": []}
        log.warning("%s/%s: cannot read claims or classes: %s", namespace, name, exc.reason)
        return storage_growth.StoragePlan(
            (),
            f"the operator may not read this namespace's claims or the StorageClasses "
            f"({exc.status}); give it the chart's rights",
            reason="StorageUnreadable",
        )
    claims = [storage_growth.claim_of(c, default_class) for c in pvcs]
    step = storage_growth.plan(size, claims, expandable)
    for claim in step.grow:
        log.info("%s/%s: growing the claim %s to %s", namespace, name, claim, size)
        await ctx.kube.resize_claim(namespace, claim, size)
        events.done(body, reason="GrowingClaim", message=f"{claim} asked for {size}")
    patch.status["storage"] = storage_growth.status_of(size, claims, step)
    return step


def _with_storage(
    changes: list[conditions.Condition], storage: storage_growth.StoragePlan
) -> list[conditions.Condition]:
    """A class that cannot grow the claims makes the group Degraded; claims growing make it
    Progressing (a group that serves stays Ready meanwhile)."""
    ready_now = next((c.status for c in changes if c.type == "Ready"), None)
    if storage.problem:
        return conditions.degraded(storage.reason, storage.problem, still_ready=ready_now)
    if storage.resizing and ready_now:
        message = f"growing the claims {', '.join(storage.resizing)}"
        return [
            conditions.Condition("Progressing", True, "StorageResizing", message)
            if c.type == "Progressing"
            else c
            for c in changes
        ]
    return changes


async def _take(
    ctx: OperatorContext,
    body: dict[str, Any],
    step: Step,
    scaling_down: bool,
    info: Any,
    pod_names: list[str],
) -> None:
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    if step.action is Action.RESTART and scaling_down:
        m = _manifests(ctx, body)
        await ctx.kube.apply(m.stateful_set())
        log.info("%s/%s: %s", namespace, name, step.reason)
        events.done(body, reason="ScalingDown", message=step.reason)
    elif step.action is Action.RESTART:
        log.info("%s/%s: %s", namespace, name, step.reason)
        await ctx.kube.delete_pod(namespace, step.pod)
        events.done(body, reason="RestartingPod", message=f"{step.pod}: {step.reason}")
    elif step.action is Action.SWITCH_MASTER:
        broker_id = group_status.broker_id_of(info, step.pod, pod_names)
        if broker_id is None:
            return
        log.info("%s/%s: %s", namespace, name, step.reason)
        events.done(body, reason="MovingMaster", message=step.reason)
        try:
            await group_leadership.switch_master(await ctx.controller(namespace), name, broker_id)
        except ClientError as exc:
            raise kopf.TemporaryError(f"moving the master: {exc}", delay=5) from None


def _alternative_names(body: Mapping[str, Any]) -> list[str]:
    return [
        str(n) for n in ((body.get("spec") or {}).get("tls") or {}).get("alternativeNames") or []
    ]


async def _roll_by_hand(ctx: OperatorContext, body: dict[str, Any], pods: list[Any]) -> list[Any]:
    """capstan.io/manual-rolling-update on the group: the annotation moves onto each of its
    pods (which the roller then restarts one by one, each new pod without it) and off the
    group, so the roll happens once. The pods as they are now."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    for pod in pods:
        await ctx.kube.annotate_pod(
            namespace, pod.metadata.name, {names.MANUAL_ROLL_ANNOTATION: "true"}
        )
    await ctx.kube.annotate_custom(PLURAL, namespace, name, {names.MANUAL_ROLL_ANNOTATION: None})
    log.info("%s/%s: a manual rolling update of %d pods", namespace, name, len(pods))
    events.done(body, reason="ManualRollingUpdate", message=f"restarting {len(pods)} pods in turn")
    return list(await ctx.kube.pods(namespace, names.selector_labels(name, COMPONENT)))


def _pod_view(pod: Any, sts: Mapping[str, Any], stuck: bool) -> PodView:
    meta = pod.metadata
    revision = (sts.get("status") or {}).get("updateRevision")
    ready = (
        pod.status is not None
        and pod.status.phase == "Running"
        and meta.deletion_timestamp is None
        and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())
    )
    ordinal = int(meta.name.rsplit("-", 1)[1])
    outdated = bool(revision) and (meta.labels or {}).get("controller-revision-hash") != revision
    # A restart asked for by hand counts as a change to roll out: the same safe order.
    asked = (meta.annotations or {}).get(names.MANUAL_ROLL_ANNOTATION) == "true"
    return PodView(meta.name, ordinal, outdated or asked, ready, stuck)
