"""ACL policy entries between the model (acl.py) and capstan.v1's wire message, for the
broker's admin service and the operator's CapstanUser sync alike."""

from __future__ import annotations

from typing import Any

from capstan.security.acl import PolicyEntry
from capstan.v1 import admin_pb2 as pb


def entry_document(entry: pb.PolicyEntry) -> dict[str, Any]:
    """The entry as `PolicyEntry.from_document` reads it (Allow when no decision)."""
    doc: dict[str, Any] = {
        "resources": list(entry.resources),
        "actions": list(entry.actions),
        "decision": entry.decision or "Allow",
    }
    if entry.source_ips:
        doc["sourceIps"] = list(entry.source_ips)
    return doc


def entry_to_wire(entry: PolicyEntry) -> pb.PolicyEntry:
    doc = entry.to_document()
    return pb.PolicyEntry(
        resources=doc["resources"],
        actions=doc["actions"],
        decision=doc["decision"],
        source_ips=doc.get("sourceIps", []),
    )
