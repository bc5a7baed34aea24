"""Growing a BrokerGroup's volume claims when its spec.storage.size grows.

A StatefulSet's claim template cannot change, so the claims are grown one by one: each
bound claim smaller than the size asked for is patched to it, when its StorageClass allows
expansion (`allowVolumeExpansion`); the volume's driver and the kubelet then grow the
volume and the file system, and the claim's status.capacity shows it. A claim not yet bound
waits for its pod. A class that does not allow expansion turns the group Degraded, naming
the class, and no claim is touched. The StatefulSet itself is made again with the new size
(deleted with its pods orphaned, then applied: broker_group_handlers.py), so replicas added
later start at that size.

`plan` decides from what it is shown (pure); status.storage reports each claim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from capstan.operator.quantity import QuantityError, size_in_bytes

DEFAULT_CLASS_ANNOTATIONS = (
    "storageclass.kubernetes.io/is-default-class",
    "storageclass.beta.kubernetes.io/is-default-class",
)


@dataclass(frozen=True)
class Claim:
    name: str
    requested: str
    capacity: str
    """status.capacity.storage: "" until bound."""
    bound: bool
    class_name: str
    """Its StorageClass, the cluster's default when the claim names none; "" for none."""


@dataclass(frozen=True)
class StoragePlan:
    grow: tuple[str, ...]
    """Claims to patch to the size asked for."""
    problem: str = ""
    """Why claims that must grow cannot (Degraded), "" when none."""
    resizing: tuple[str, ...] = ()
    """Claims asked to grow whose capacity is not there yet (or that wait for binding)."""
    reason: str = "StorageNotExpandable"
    """The Degraded condition's reason when there is a problem."""

    @property
    def done(self) -> bool:
        return not self.grow and not self.problem and not self.resizing


def plan(size: str, claims: Sequence[Claim], expandable: Mapping[str, bool]) -> StoragePlan:
    """What to do for `claims` to reach `size`; `expandable` tells each StorageClass's
    allowVolumeExpansion (a class it does not know: not expandable)."""
    wanted = size_in_bytes(size)
    grow: list[str] = []
    refused: dict[str, list[str]] = {}
    resizing: list[str] = []
    for claim in claims:
        if _bytes(claim.requested) < wanted:
            if not claim.bound:
                resizing.append(claim.name)  # its pod binds it; then it grows
            elif expandable.get(claim.class_name, False):
                grow.append(claim.name)
                resizing.append(claim.name)
            else:
                refused.setdefault(claim.class_name or "(none)", []).append(claim.name)
        elif claim.bound and _bytes(claim.capacity) < wanted:
            resizing.append(claim.name)
    problem = "; ".join(
        f"the StorageClass {cls} does not allow volume expansion (allowVolumeExpansion), so "
        f"{', '.join(names)} cannot grow to {size}"
        for cls, names in sorted(refused.items())
    )
    if problem:
        return StoragePlan((), problem, tuple(resizing))
    return StoragePlan(tuple(grow), "", tuple(resizing))


def _bytes(text: str) -> int:
    try:
        return size_in_bytes(text) if text else 0
    except QuantityError:
        return 0


def smaller_than(size: str, pvcs: Sequence[Any]) -> bool:
    """Whether any of the V1PersistentVolumeClaims asks for less than `size`."""
    wanted = size_in_bytes(size)
    return any(_bytes(claim_of(pvc, "").requested) < wanted for pvc in pvcs)


def claim_of(pvc: Any, default_class: str) -> Claim:
    """A Claim from a V1PersistentVolumeClaim."""
    spec, status = pvc.spec, pvc.status
    requested = ((spec.resources.requests or {}) if spec.resources else {}).get("storage", "")
    capacity = ((status.capacity or {}) if status else {}).get("storage", "")
    return Claim(
        pvc.metadata.name,
        str(requested),
        str(capacity),
        bool(status and status.phase == "Bound"),
        spec.storage_class_name if spec.storage_class_name is not None else default_class,
    )


def classes_of(storage_classes: Sequence[Any]) -> tuple[dict[str, bool], str]:
    """(allowVolumeExpansion by class name, the default class's name or "")."""
    expandable = {c.metadata.name: bool(c.allow_volume_expansion) for c in storage_classes}
    default = ""
    for c in storage_classes:
        annotations = c.metadata.annotations or {}
        if any(annotations.get(a) == "true" for a in DEFAULT_CLASS_ANNOTATIONS):
            default = c.metadata.name
    return expandable, default


def status_of(size: str, claims: Sequence[Claim], step: StoragePlan) -> dict[str, Any]:
    """status.storage: the size asked for, each claim's request and capacity, and whether
    they are all there."""
    return {
        "size": size,
        "ready": step.done,
        "claims": [
            {"name": c.name, "requested": c.requested, "capacity": c.capacity or None}
            for c in sorted(claims, key=lambda c: c.name)
        ],
    }
