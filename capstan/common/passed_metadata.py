"""The metadata a server passes on when it calls another on a caller's behalf (a slave to
its master, the controller to each broker group): the caller's own entries (its client id,
its signature), never gRPC's transport entries."""

from __future__ import annotations

from typing import Any

_NOT_PASSED = frozenset({"user-agent", "content-type", "te"})


def passed_metadata(context: Any, also_dropped: frozenset[str] = frozenset()) -> list[Any]:
    """The caller's metadata, without transport entries and those in `also_dropped`."""
    return [
        (key, value)
        for key, value in context.invocation_metadata() or ()
        if not key.startswith((":", "grpc-")) and key not in _NOT_PASSED | also_dropped
    ]
