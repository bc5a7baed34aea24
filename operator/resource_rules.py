"""The rules a BrokerGroup, Topic, ConsumerGroup or CapstanUser must keep beyond its CRD's schema.

The CRDs state these rules twice: as CEL (`x-kubernetes-validations`), which API servers
enforce from 1.25, and here, which the operator's validating webhook enforces on every
version (1.20 ignores CEL). Each rule's message is the CEL rule's message, word for word
(tests/operator/test_resource_rules.py holds the two sets equal), and names its field.

Some rules need more than the object: a broker config is checked by loading it as the
broker would, so an unknown or mistyped key is refused by name before any pod runs it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from capstan.common.broker_settings import BrokerSettings
from capstan.common.errors import ConfigError
from capstan.common.settings import settings_from_mapping
from capstan.operator.manifests import names
from capstan.operator.manifests.pod_parts import BROKER_COMPONENT
from capstan.operator.manifests.pod_template import template_errors
from capstan.operator.quantity import QuantityError, size_in_bytes
from capstan.security.acl import AclError, PolicyEntry

OPERATOR_OWNED_BROKER_KEYS = (
    "broker_name",
    "data_dir",
    "listen_host",
    "grpc_port",
    "http_port",
    "advertised_host",
    "route_endpoint",
    "zone",
    "zone_file",
    "store.store_host",
    "replication.controller_address",
    "replication.role",
    "replication.broker_id",
    "replication.master_address",
    "replication.peers",
    "replication.replicas",
    "replication.min_in_sync_replicas",
    # TLS and authentication: the operator's, from the namespace's secrets (or off with
    # --insecure), the same for every group of a namespace and its controller.
    "tls.enabled",
    "tls.cert_file",
    "tls.key_file",
    "tls.ca_file",
    "auth.enabled",
    "auth.cluster_secret_file",
    "auth.init_user_file",
)
"""brokerConfig keys the operator sets from the resource and the pod; a resource that
sets them is refused rather than silently overridden."""


@dataclass(frozen=True)
class FieldError:
    field: str
    """The field's path from the resource's root, e.g. spec.minInSyncReplicas."""
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


Spec = Mapping[str, Any]
DEFAULT_STORAGE = "10Gi"
"""spec.storage.size when unset (the CRD's default)."""


def broker_group_errors(spec: Spec, old: Spec | None = None) -> list[FieldError]:
    errors = []
    replicas = spec.get("replicas", 2)
    if spec.get("minInSyncReplicas", 1) > replicas:
        errors.append(
            FieldError("spec.minInSyncReplicas", "minInSyncReplicas must not exceed replicas")
        )
    if old is not None and "storage" in old:
        errors.extend(_storage_change_errors(spec.get("storage") or {}, old["storage"] or {}))
    errors.extend(broker_config_errors(spec.get("brokerConfig") or {}))
    template = spec.get("template")
    errors.extend(pod_template_errors(template, "spec.template", BROKER_COMPONENT))
    if spec.get("resources") and ((template or {}).get("container") or {}).get("resources"):
        errors.append(
            FieldError(
                "spec.template.container.resources",
                "the broker's resources are set in spec.resources already; set them in one place",
            )
        )
    errors.extend(_listener_errors(spec.get("listeners") or ()))
    for i, name in enumerate((spec.get("tls") or {}).get("alternativeNames") or ()):
        if not _host_name(str(name)):
            errors.append(
                FieldError(
                    f"spec.tls.alternativeNames[{i}]",
                    f"{name!r} is neither an IP address nor a DNS name",
                )
            )
    return errors


def _listener_errors(listeners: Any) -> list[FieldError]:
    """The CEL rule's twin (nodePort only on a nodeport listener), plus what the schema's
    list-map and patterns say, for servers that check neither: unique names, CIDRs."""
    errors = []
    seen: set[str] = set()
    for i, listener in enumerate(listeners):
        where = f"spec.listeners[{i}]"
        if not isinstance(listener, Mapping):
            errors.append(FieldError(where, "must be a mapping with name and type"))
            continue
        name = listener.get("name")
        if name in seen:
            errors.append(FieldError(f"{where}.name", f"listener {name!r} is named twice"))
        seen.add(str(name))
        if listener.get("type") != "nodeport" and "nodePort" in listener:
            errors.append(
                FieldError(f"{where}.nodePort", "nodePort is for listeners of type nodeport")
            )
        for j, cidr in enumerate(listener.get("allowFrom") or ()):
            try:
                ipaddress.ip_network(str(cidr), strict=False)
            except ValueError:
                errors.append(
                    FieldError(f"{where}.allowFrom[{j}]", f"{cidr!r} is not a CIDR (a.b.c.d/n)")
                )
    return errors


def _storage_change_errors(new: Spec, old: Spec) -> list[FieldError]:
    """The class stays; the size may grow, not shrink (a claim cannot)."""
    if new.get("storageClassName", "") != old.get("storageClassName", ""):
        return [
            FieldError(
                "spec.storage.storageClassName",
                "storageClassName is immutable; create a new BrokerGroup to move to another class",
            )
        ]
    before, after = old.get("size", DEFAULT_STORAGE), new.get("size", DEFAULT_STORAGE)
    try:
        shrinks = size_in_bytes(after) < size_in_bytes(before)
    except QuantityError as exc:
        return [FieldError("spec.storage.size", str(exc))]
    if shrinks:
        return [
            FieldError(
                "spec.storage.size",
                f"may only grow: a claim cannot shrink from {before} to {after}",
            )
        ]
    return []


_DNS_NAME = re.compile(r"(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _host_name(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return len(name) <= 253 and _DNS_NAME.fullmatch(name) is not None
    return True


def pod_template_errors(template: Any, where: str, component: str) -> list[FieldError]:
    """A BrokerGroup's spec.template, or the controller's template (`component`
    "controller"): what pod_template.py takes, leaving the operator's labels, annotations
    and variables alone."""
    reserved = names.labels("-", component)
    return [
        FieldError(f, m)
        for f, m in template_errors(
            template, where, reserved, (names.CONFIG_HASH_ANNOTATION, names.ZONE_ANNOTATION)
        )
    ]


def broker_config_errors(config: Mapping[str, Any]) -> list[FieldError]:
    """Refuse keys the operator owns, then load the rest as the broker will."""
    where = "spec.brokerConfig"
    for key in OPERATOR_OWNED_BROKER_KEYS:
        section, _, name = key.rpartition(".")
        holder = config.get(section) if section else config
        if isinstance(holder, Mapping) and name in holder:
            return [FieldError(f"{where}.{key}", "is set by the operator; leave it out")]
    try:
        settings_from_mapping(BrokerSettings, config)
    except ConfigError as exc:
        return [FieldError(where, str(exc))]
    return []


def topic_errors(spec: Spec, old: Spec | None = None) -> list[FieldError]:
    errors = []
    if old is not None and "topicName" in old and spec.get("topicName") != old["topicName"]:
        errors.append(FieldError("spec.topicName", "topicName is immutable"))
    if "readQueues" in spec and spec["readQueues"] < spec.get("queues", 8):
        errors.append(
            FieldError("spec.readQueues", "readQueues must not be below queues (the write queues)")
        )
    static = bool(spec.get("static", False))
    if old is not None and static != bool(old.get("static", False)):
        errors.append(
            FieldError(
                "spec.static", "static is immutable; a topic cannot become static or stop being one"
            )
        )
    elif static and old is not None and spec.get("queues", 8) != old.get("queues", 8):
        errors.append(
            FieldError("spec.queues", "a static topic's logic queue count (queues) cannot change")
        )
    if static and "readQueues" in spec:
        errors.append(
            FieldError(
                "spec.readQueues",
                "a static topic has no readQueues; each logic queue is read where its items "
                "are kept",
            )
        )
    return errors


def consumer_group_errors(spec: Spec, old: Spec | None = None) -> list[FieldError]:
    if old is not None and "groupName" in old and spec.get("groupName") != old["groupName"]:
        return [FieldError("spec.groupName", "groupName is immutable")]
    return []


def capstan_user_errors(spec: Spec, old: Spec | None = None) -> list[FieldError]:
    if old is not None and "userName" in old and spec.get("userName") != old["userName"]:
        return [FieldError("spec.userName", "userName is immutable")]
    for i, entry in enumerate(spec.get("acl") or ()):
        try:
            PolicyEntry.from_document(dict(entry))
        except (AclError, TypeError, ValueError) as exc:
            return [FieldError(f"spec.acl[{i}]", str(exc))]
    return []


RULES = {
    "BrokerGroup": broker_group_errors,
    "Topic": topic_errors,
    "ConsumerGroup": consumer_group_errors,
    "CapstanUser": capstan_user_errors,
}
