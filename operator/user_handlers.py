"""CapstanUser handlers: the user's keys are made once and kept in the Secret
`capstan-user-<name>` (access-key, secret-key, credentials.json), and the user, with its
whole policy, is put on each named BrokerGroup through its admin API; a timer finds and
repairs drift (the resource wins) and pushes keys changed in the Secret (edited, or
deleted and so made again). A BrokerGroup dropped from the spec loses the user; a deleted
CapstanUser is deleted from its groups (its finalizer gives up after DELETE_TIMEOUT_S on
groups that cannot be reached) and its Secret goes with it.

A CapstanUser in a namespace the operator runs without authentication (`--insecure`) is
Degraded `AuthenticationOff`: nothing checks a key there, so nothing is made.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from typing import Any

import kopf

from capstan.client.errors import ClientError
from capstan.operator import conditions, user_sync
from capstan.operator.cluster_secrets import decoded, secret_manifest
from capstan.operator.manifests import names
from capstan.operator.manifests.cluster import owner_reference
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
from capstan.security.acl import AclError

log = logging.getLogger(__name__)

PLURAL = "capstanusers"
SYNC_INTERVAL_S = 10.0
DELETE_TIMEOUT_S = 120.0
CREDENTIALS_FILE_KEY = "credentials.json"


def register(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    @kopf.on.resume(API_GROUP, API_VERSION, PLURAL, registry=registry, backoff=RETRY_S)
    @kopf.on.create(API_GROUP, API_VERSION, PLURAL, registry=registry, backoff=RETRY_S)
    @kopf.on.update(
        API_GROUP, API_VERSION, PLURAL, field="spec", registry=registry, backoff=RETRY_S
    )
    @kopf.timer(
        API_GROUP, API_VERSION, PLURAL, interval=SYNC_INTERVAL_S, registry=registry, backoff=RETRY_S
    )
    async def sync_user(
        body: kopf.Body, status: kopf.Status, stopped: Any = None, **_: Any
    ) -> None:
        if body.get("metadata", {}).get("deletionTimestamp"):
            return
        await unless_stopped(_sync_user_once(body, status), stopped)

    async def _sync_user_once(body: kopf.Body, status: kopf.Status) -> None:
        async with ctx.one_at_a_time("CapstanUser", body):
            with ctx.metrics.reconcile("CapstanUser"):
                async with own_status(ctx.kube, PLURAL, body) as patch:
                    await _sync_user(ctx, dict(body), status, patch)

    @kopf.on.delete(API_GROUP, API_VERSION, PLURAL, registry=registry, backoff=RETRY_S)
    async def delete_user(body: kopf.Body, runtime: Any, **_: Any) -> None:
        with ctx.metrics.reconcile("CapstanUser"):
            await _delete_user(ctx, dict(body), runtime.total_seconds())


async def _sync_user(
    ctx: OperatorContext, body: dict[str, Any], status: Mapping[str, Any], patch: kopf.Patch
) -> None:
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace, generation = meta["namespace"], int(meta.get("generation", 0))
    patch.status["observedGeneration"] = generation

    def degraded(reason: str, message: str) -> None:
        patch.status["conditions"] = status_conditions(
            status, conditions.degraded(reason, message), generation
        )

    if not ctx.secure:
        degraded(
            "AuthenticationOff",
            "the operator runs this namespace's brokers without authentication (--insecure):"
            " a user would change nothing",
        )
        return
    try:
        wanted = user_sync.wanted_user(meta["name"], spec)
    except AclError as exc:
        degraded("InvalidSpec", str(exc))
        return
    patch.status["userName"] = wanted.name
    groups = list(spec.get("brokerGroups") or [])
    missing = await ctx.missing_broker_groups(namespace, groups)
    if missing:
        patch.status["conditions"] = missing_groups_conditions(status, missing, generation)
        return
    secret_key, keys_version = await _keys(ctx, body, wanted.name)
    patch.status["secretName"] = user_sync.user_secret(meta["name"])
    applied = {e.get("name"): e for e in status.get("brokerGroups") or []}
    entries, problems = [], []
    for group in groups:
        entry: dict[str, Any] = {"name": group}
        try:
            admin = await ctx.admin(namespace, group, await ctx.master_of(namespace, group))
            found = await admin.user(wanted.name)
            keys_changed = applied.get(group, {}).get("keysVersion") != keys_version
            step = user_sync.next_user_step(wanted, found, keys_changed)
            if step.action is not user_sync.UserAction.IN_SYNC:
                request = user_sync.request_of(wanted, secret_key, step)
                await admin.put_user(request, create=step.action is user_sync.UserAction.CREATE)
                log.info("%s/%s on %s: %s", namespace, wanted.name, group, step.reason)
            entry.update(phase="InSync", keysVersion=keys_version, message=step.reason)
        except ClientError as exc:
            previous = applied.get(group, {})
            entry.update(phase="Waiting", message=str(exc))
            if previous.get("keysVersion"):
                entry["keysVersion"] = previous["keysVersion"]
            problems.append(f"{group}: {exc}")
        entries.append(entry)
    for group in sorted(set(applied) - set(groups)):
        if group is None:
            continue
        try:
            admin = await ctx.admin(namespace, group, await ctx.master_of(namespace, group))
            await admin.delete_user(wanted.name)
            log.info("%s/%s removed from %s", namespace, wanted.name, group)
        except ClientError as exc:
            entries.append({**applied[group], "phase": "Removing", "message": str(exc)})
            problems.append(f"{group} (removing the user): {exc}")
    patch.status["brokerGroups"] = entries
    if problems:
        patch.status["conditions"] = status_conditions(
            status,
            conditions.progressing("BrokerGroupUnreachable", "; ".join(problems)),
            generation,
        )
        raise kopf.TemporaryError("; ".join(problems), delay=10)
    patch.status["conditions"] = status_conditions(
        status,
        conditions.ready(f"user {wanted.name} on {', '.join(groups)}"),
        generation,
    )


async def _keys(ctx: OperatorContext, body: dict[str, Any], user: str) -> tuple[str, str]:
    """The user's secret key, made on first use (or when its Secret lost it) and kept in
    its Secret, owned by the resource; and the Secret's version, which changes when the
    keys do."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], user_sync.user_secret(meta["name"])
    found = await ctx.kube.get("v1", "Secret", namespace, name)
    data = decoded(found)
    secret_key = data.get(names.SECRET_KEY_KEY, b"").decode(errors="replace")
    if data.get(names.ACCESS_KEY_KEY) != user.encode() or not 16 <= len(secret_key) <= 128:
        secret_key = secrets.token_urlsafe(32)
        keys = {
            names.ACCESS_KEY_KEY: user.encode(),
            names.SECRET_KEY_KEY: secret_key.encode(),
            CREDENTIALS_FILE_KEY: json.dumps(
                {"access_key": user, "secret_key": secret_key}
            ).encode(),
        }
        labels = names.labels(meta["name"], "user")
        found = await ctx.kube.apply(
            secret_manifest(namespace, name, keys, labels, [owner_reference(body)])
        )
        log.info("%s/%s written: keys of user %s", namespace, name, user)
    return secret_key, str((found or {}).get("metadata", {}).get("resourceVersion", ""))


async def _delete_user(ctx: OperatorContext, body: dict[str, Any], waited_s: float) -> None:
    meta, spec = body["metadata"], body.get("spec") or {}
    namespace = meta["namespace"]
    if not ctx.secure:
        return
    name = str(spec.get("userName") or meta["name"])
    groups = {
        str(g)
        for g in (
            *(spec.get("brokerGroups") or []),
            *(e.get("name") for e in (body.get("status") or {}).get("brokerGroups") or []),
        )
        if g
    }
    missing = {g for _, g in await ctx.missing_broker_groups(namespace, sorted(groups), True)}
    problems = []
    for group in sorted(groups - missing):
        try:
            admin = await ctx.admin(namespace, group, await ctx.master_of(namespace, group))
            await admin.delete_user(name)
        except ClientError as exc:
            problems.append(f"{group}: {exc}")
    if problems and waited_s < DELETE_TIMEOUT_S:
        raise kopf.TemporaryError("deleting the user: " + "; ".join(problems), delay=RETRY_S)
    if problems:
        log.warning(
            "%s/%s: gave up deleting the user after %.0f s: %s",
            namespace,
            name,
            waited_s,
            "; ".join(problems),
        )
