"""A user's pod template (a BrokerGroup's `spec.template`, the controller's chart value),
laid over the pods the operator builds, in the manner of Strimzi's templates.

    template:
      pod:
        metadata: {labels: {...}, annotations: {...}}
        tolerations: [...]
        nodeSelector: {...}
        affinity: {...}
        topologySpreadConstraints: [...]
        priorityClassName: ...
        imagePullSecrets: [{name: ...}]
        securityContext: {...}
      container:
        resources: {...}
        securityContext: {...}
        env: [{name: ..., value: ...}]

How each part meets what the operator sets:
- labels and annotations are added; the operator's own (the selector labels, the config
  hash) are refused by the rules rather than overridden.
- tolerations, nodeSelector, topologySpreadConstraints, priorityClassName and
  imagePullSecrets are the user's alone: the operator sets none of them.
- affinity: each kind the user gives (nodeAffinity, podAffinity, podAntiAffinity) replaces
  the operator's of that kind; a BrokerGroup's `antiAffinity` applies only while the
  template gives no podAntiAffinity.
- securityContext (pod and container): the user's keys over the operator's restricted ones.
- env: added after the operator's variables; names the operator sets are refused.
- resources: the container's requests and limits (a BrokerGroup may set them here or in
  `spec.resources`, not both).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

OPERATOR_ENV = ("POD_NAME", "POD_NAMESPACE", "POD_IP")
"""The downward-API variables every pod gets (pod_parts.downward_env)."""

POD_FIELDS = (
    "metadata",
    "tolerations",
    "nodeSelector",
    "affinity",
    "topologySpreadConstraints",
    "priorityClassName",
    "imagePullSecrets",
    "securityContext",
)
CONTAINER_FIELDS = ("resources", "securityContext", "env")
USER_ONLY = (
    "tolerations",
    "nodeSelector",
    "topologySpreadConstraints",
    "priorityClassName",
    "imagePullSecrets",
)
"""Pod fields the operator sets none of: the template's as given."""
AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
_LISTS = ("tolerations", "topologySpreadConstraints", "imagePullSecrets")
_MAPPINGS = ("nodeSelector", "affinity", "securityContext")


def template_errors(
    template: Any,
    where: str,
    reserved_labels: Mapping[str, str],
    reserved_annotations: tuple[str, ...],
) -> list[tuple[str, str]]:
    """(field, message) for each thing wrong in `template`: the shapes the schema also states
    (a controller's template comes from a flag, which no schema checks) and what the operator
    keeps for itself."""
    if template is None:
        return []
    if not isinstance(template, Mapping):
        return [(where, "must be a mapping with pod and container")]
    errors: list[tuple[str, str]] = []
    unknown = sorted(set(template) - {"pod", "container"})
    if unknown:
        errors.append((where, f"unknown fields {', '.join(unknown)}; it takes pod and container"))
    pod = template.get("pod") or {}
    container = template.get("container") or {}
    for part, value, known in (
        ("pod", pod, POD_FIELDS),
        ("container", container, CONTAINER_FIELDS),
    ):
        if not isinstance(value, Mapping):
            errors.append((f"{where}.{part}", "must be a mapping"))
            continue
        extra = sorted(set(value) - set(known))
        if extra:
            errors.append(
                (
                    f"{where}.{part}",
                    f"unknown fields {', '.join(extra)}; it takes {', '.join(known)}",
                )
            )
    if errors:
        return errors
    errors += _shape_errors(pod, f"{where}.pod")
    meta = pod.get("metadata") or {}
    if not isinstance(meta, Mapping):
        return [*errors, (f"{where}.pod.metadata", "must be a mapping of labels and annotations")]
    for kind, reserved in (
        ("labels", tuple(reserved_labels)),
        ("annotations", reserved_annotations),
    ):
        values = meta.get(kind) or {}
        if not isinstance(values, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in values.items()
        ):
            errors.append((f"{where}.pod.metadata.{kind}", "must map names to strings"))
            continue
        for key in values:
            if key in reserved:
                errors.append(
                    (f"{where}.pod.metadata.{kind}.{key}", "is set by the operator; leave it out")
                )
    affinity = pod.get("affinity") or {}
    extra = sorted(set(affinity) - set(AFFINITY_KINDS)) if isinstance(affinity, Mapping) else []
    if extra:
        errors.append(
            (
                f"{where}.pod.affinity",
                f"unknown kinds {', '.join(extra)}; it takes {', '.join(AFFINITY_KINDS)}",
            )
        )
    for i, secret in enumerate(pod.get("imagePullSecrets") or ()):
        if not isinstance(secret, Mapping) or not isinstance(secret.get("name"), str):
            errors.append((f"{where}.pod.imagePullSecrets[{i}]", "must be {name: <a Secret>}"))
    errors += _shape_errors(container, f"{where}.container")
    for i, var in enumerate(container.get("env") or ()):
        if not isinstance(var, Mapping) or not isinstance(var.get("name"), str):
            errors.append((f"{where}.container.env[{i}]", "must name its variable"))
        elif var["name"] in OPERATOR_ENV:
            errors.append(
                (
                    f"{where}.container.env[{i}]",
                    f"{var['name']} is set by the operator; leave it out",
                )
            )
    return errors


def _shape_errors(part: Mapping[str, Any], where: str) -> list[tuple[str, str]]:
    wanted = {
        **dict.fromkeys((*_LISTS, "env"), (list, "a list")),
        **dict.fromkeys((*_MAPPINGS, "resources"), (Mapping, "a mapping")),
        "priorityClassName": (str, "a string"),
    }
    return [
        (f"{where}.{key}", f"must be {what}")
        for key, (kind, what) in wanted.items()
        if key in part and not isinstance(part[key], kind)
    ]


def lay_over(
    template: Mapping[str, Any] | None, pod: dict[str, Any], container: dict[str, Any]
) -> None:
    """Lay `template` over `pod` (a pod template: metadata and spec) and its `container`,
    in place, as the module's docstring says."""
    if not template:
        return
    user_pod = copy.deepcopy(dict(template.get("pod") or {}))
    user_container = copy.deepcopy(dict(template.get("container") or {}))
    meta = pod.setdefault("metadata", {})
    user_meta = user_pod.get("metadata") or {}
    for kind in ("labels", "annotations"):
        if user_meta.get(kind):
            meta[kind] = {**user_meta[kind], **(meta.get(kind) or {})}
    spec = pod["spec"]
    for key in USER_ONLY:
        if key in user_pod and user_pod[key] not in (None, [], {}, ""):
            spec[key] = user_pod[key]
    if user_pod.get("affinity"):
        spec["affinity"] = {**(spec.get("affinity") or {}), **user_pod["affinity"]}
    if user_pod.get("securityContext"):
        spec["securityContext"] = {
            **(spec.get("securityContext") or {}),
            **user_pod["securityContext"],
        }
    if user_container.get("securityContext"):
        container["securityContext"] = {
            **(container.get("securityContext") or {}),
            **user_container["securityContext"],
        }
    if user_container.get("resources"):
        container["resources"] = user_container["resources"]
    if user_container.get("env"):
        container["env"] = [*(container.get("env") or []), *user_container["env"]]
