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
