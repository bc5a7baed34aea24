"""The operator's validating admission webhook (Kopf serves it and keeps a
ValidatingWebhookConfiguration, `capstan.io` or the one --webhook-configuration names,
pointing at it).

- Create and update of every kind: the rules of resource_rules.py, the twins of the CRDs'
  CEL rules, which API servers before 1.25 do not enforce; a refusal names the field.
- Delete of a BrokerGroup whose brokers still hold unconsumed, undecided or delayed
  messages is refused with what they hold, unless the resource carries the annotation
  `capstan.io/delete-with-messages: "true"`. A group that cannot be asked within the call's
  time is let go, and so is every group of a namespace being deleted (a webhook must not
  make a namespace undeletable).
- Pod evictions: a broker pod's eviction that would take a master before it hands over or
  leave fewer than minInSyncReplicas in sync is refused with 429 and the pod handed to the
  roller (drain_guard.py); other pods' evictions pass.

Its failure policy is Ignore: with the operator down, changes go through unchecked, and the
handlers refuse a spec that breaks a rule with a Degraded condition instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from capstan.client.errors import ClientError
from capstan.operator import drain_guard, resource_rules
from capstan.operator.broker_admin import BrokerGroupAdmin
from capstan.operator.operator_context import API_GROUP, API_VERSION, OperatorContext
from capstan.operator.scaling import deletion_refusal

FORCE_DELETE_ANNOTATION = "capstan.io/delete-with-messages"
DELETE_CHECK_S = 10.0
CONFIGURATION_NAME = "capstan.io"

_KINDS = {
    "brokergroups": "BrokerGroup",
    "topics": "Topic",
    "consumergroups": "ConsumerGroup",
    "capstanusers": "CapstanUser",
}


@dataclass(frozen=True)
class ServiceRef:
    """A Service in front of the operator's pod, through which the API server calls."""

    namespace: str
    name: str
    port: int = 443

    @classmethod
    def parse(cls, text: str) -> ServiceRef:
        """`namespace/name` or `namespace/name:port`."""
        where, _, port = text.partition(":")
        namespace, _, name = where.partition("/")
        if not namespace or not name or (port and not port.isdigit()):
            raise ValueError(f"{text!r}: expected NAMESPACE/NAME[:PORT]")
        return cls(namespace, name, int(port) if port else 443)

    def host(self) -> str:
        """The name the API server checks the certificate against."""
        return f"{self.name}.{self.namespace}.svc"


@dataclass(frozen=True)
class WebhookOptions:
    port: int
    """Where the HTTPS server listens (on the operator's listen host)."""
    host: str
    """The host name or address the API server calls (when not through `service`)."""
    certfile: Path
    keyfile: Path
    """The server's certificate (for `host`, or the Service's name) and key."""
    cafile: Path | None = None
    """The CA bundle given to the API server; None: the certificate itself (self-signed)."""
    service: ServiceRef | None = None
    """Called through this Service (clientConfig.service) rather than at a URL: in a
    cluster, API servers reach Services where they often cannot resolve their names."""
    configuration: str = CONFIGURATION_NAME
    """The Validating/MutatingWebhookConfiguration the operator keeps pointing at itself;
    made by the operator when absent (the chart makes it, so it goes with the release)."""


class ServiceWebhookServer(kopf.WebhookServer):
    """kopf.WebhookServer, whose webhooks name a Service instead of a URL."""

    def __init__(self, service: ServiceRef, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.service = service

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for config in super().__call__(fn):
            ref = {"namespace": self.service.namespace, "name": self.service.name}
            through: dict[str, Any] = {"service": {**ref, "port": self.service.port}}
            if "caBundle" in config:
                through["caBundle"] = config["caBundle"]
            yield through


def spec_refusal(kind: str, spec: Mapping[str, Any], old: Mapping[str, Any] | None) -> str | None:
    errors = resource_rules.RULES[kind](spec, old)
    return "; ".join(str(e) for e in errors) if errors else None


def register(registry: kopf.OperatorRegistry, ctx: OperatorContext) -> None:
    for plural, kind in _KINDS.items():
        _register_spec_check(registry, plural, kind)

    @kopf.on.validate(
        API_GROUP,
        API_VERSION,
        "brokergroups",
        id="capstan-drained-delete",
        operations=["DELETE"],
        ignore_failures=True,
        registry=registry,
    )
    async def refuse_undrained_delete(**kwargs: Any) -> None:
        target = dict(kwargs["old"] if kwargs.get("old") is not None else kwargs["body"])
        meta = target["metadata"]
        if await _namespace_going(ctx, meta["namespace"]):
            return  # deleting the namespace deletes what it holds, messages included
        master = str((target.get("status") or {}).get("master") or "")
        try:
            admin = await ctx.admin(meta["namespace"], meta["name"], master) if master else None
        except ClientError:
            admin = None  # the namespace's secrets are gone: nothing of it can be reached
        refusal = await undrained_refusal(admin, target)
        if refusal:
            raise kopf.AdmissionError(refusal, code=409)

    @kopf.on.validate(
        "v1",
        "pods",
        subresource="eviction",
        id="capstan-drain",
        operations=["CREATE"],
        ignore_failures=True,
        side_effects=True,
        registry=registry,
    )
    async def keep_the_sync_state_set(**kwargs: Any) -> None:
        meta = kwargs["body"].get("metadata") or {}
        namespace, pod = meta.get("namespace") or "", meta.get("name") or ""
        if not namespace or not pod:
            return
        try:
            refusal = await drain_guard.judge(ctx, namespace, pod, bool(kwargs.get("dryrun")))
        except ApiException as exc:
            if exc.status == 403:
                return  # a namespace the operator may not read holds no group of its own
            raise
        if refusal:
            raise kopf.AdmissionError(refusal, code=429)


async def _namespace_going(ctx: OperatorContext, namespace: str) -> bool:
    try:
        return await asyncio.wait_for(ctx.kube.namespace_terminating(namespace), DELETE_CHECK_S)
    except (ApiException, TimeoutError):
        return False


def _register_spec_check(registry: kopf.OperatorRegistry, plural: str, kind: str) -> None:
    @kopf.on.validate(
        API_GROUP,
        API_VERSION,
        plural,
        id=f"capstan-{plural}",
        operations=["CREATE", "UPDATE"],
        ignore_failures=True,
        registry=registry,
    )
    def check_spec(**kwargs: Any) -> None:
        body, old = kwargs["body"], kwargs.get("old")
        old_spec = dict(old.get("spec") or {}) if old is not None else None
        refusal = spec_refusal(kind, dict(body.get("spec") or {}), old_spec)
        if refusal:
            raise kopf.AdmissionError(f"{kind} {body['metadata'].get('name', '')}: {refusal}")


async def undrained_refusal(admin: BrokerGroupAdmin | None, body: Mapping[str, Any]) -> str | None:
    """Why the BrokerGroup `body` may not be deleted yet, or None. `admin` reaches its
    master; None when it has none (nothing runs that could hold a message)."""
    meta = body["metadata"]
    annotations = meta.get("annotations") or {}
    if admin is None or annotations.get(FORCE_DELETE_ANNOTATION) == "true":
        return None
    try:
        backlog = await asyncio.wait_for(admin.backlog(), DELETE_CHECK_S)
    except (ClientError, TimeoutError):
        return None
    refusal = deletion_refusal(backlog)
    if refusal is None:
        return None
    return (
        f"BrokerGroup {meta['name']}: {refusal.reason}; or annotate it "
        f'{FORCE_DELETE_ANNOTATION}="true" to delete it with them'
    )


def configure(settings: kopf.OperatorSettings, listen_host: str, options: WebhookOptions) -> None:
    serving: dict[str, Any] = {
        "addr": listen_host,
        "port": options.port,
        "certfile": str(options.certfile),
        "pkeyfile": str(options.keyfile),
        "cafile": str(options.cafile or options.certfile),
    }
    if options.service is not None:
        settings.admission.server = ServiceWebhookServer(options.service, **serving)
    else:
        settings.admission.server = kopf.WebhookServer(host=options.host, **serving)
    settings.admission.managed = options.configuration
