"""Pieces every pod the operator builds shares."""

from __future__ import annotations

from typing import Any


def downward_env() -> list[dict[str, Any]]:
    def field_ref(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    return [
        field_ref("POD_NAME", "metadata.name"),
        field_ref("POD_NAMESPACE", "metadata.namespace"),
        field_ref("POD_IP", "status.podIP"),
    ]


def restricted_container() -> dict[str, Any]:
    """The restricted Pod Security Standard."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


SCRATCH = "tmp"


def scratch_volume() -> dict[str, Any]:
    """A writable /tmp under the read-only root filesystem: the image's HOME, where the
    official RocketMQ client that Capstan imports makes its log folder (~/logs) at import."""
    return {"name": SCRATCH, "emptyDir": {}}


def scratch_mount() -> dict[str, Any]:
    return {"name": SCRATCH, "mountPath": "/tmp"}
