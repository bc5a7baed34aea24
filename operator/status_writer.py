"""A timer handler's status, written by the operator itself rather than through kopf.

Kopf applies the patch a timer handler fills after the handler returns and outside its error
handling: an API error there (a refused value, an API server that timed out) ends that
object's timer for good, without a log line, and its status freezes while the operator runs
on. Handlers that run on a timer fill a patch of their own instead; `own_status` writes it
when the handler ends, and a failed write is a temporary error that kopf logs and retries.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import kopf
from kubernetes.client import ApiException

from capstan.operator.kube_objects import KubeObjects
from capstan.operator.operator_context import RETRY_S


@asynccontextmanager
async def own_status(
    kube: KubeObjects, plural: str, body: kopf.Body | dict[str, Any]
) -> AsyncIterator[kopf.Patch]:
    """A patch for the handler to fill; its status is merged into the object's on the way
    out, also when the handler raised (what it found before failing is shown)."""
    meta = body["metadata"]
    patch = kopf.Patch()
    try:
        yield patch
    finally:
        status = patch.get("status")
        if status:
            try:
                await kube.patch_custom_status(
                    plural, meta["namespace"], meta["name"], without_empty_strings(status)
                )
            except Exception as exc:
                raise kopf.TemporaryError(
                    f"writing the status of {meta['namespace']}/{meta['name']} failed"
                    f" ({_first_line(exc)}); retrying",
                    delay=RETRY_S,
                ) from exc


def without_empty_strings(status: Mapping[str, Any]) -> dict[str, Any]:
    """`status` with every empty string left out: as null in an object (a merge patch's
    null removes the field, so "no master" reads as no `master`) and as a missing key in a
    list's items (a merge patch replaces a list whole). Kubernetes 1.20 as Debian builds it
    refuses an empty string in a merge patch of a custom resource as "null" (seen on the
    real node: every status write of a group without a master failed)."""
    return dict(_pruned(status, in_list=False))


def _pruned(value: Any, in_list: bool) -> Any:
    if isinstance(value, Mapping):
        if in_list:
            return {k: _pruned(v, True) for k, v in value.items() if v != ""}
        return {k: None if v == "" else _pruned(v, False) for k, v in value.items()}
    if isinstance(value, list):
        return [_pruned(v, True) for v in value]
    return value


def _first_line(exc: Exception) -> str:
    """The API server's own message for a refused write, else the error's first line."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.reason or "")["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        return f"HTTP {exc.status}: {message}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
