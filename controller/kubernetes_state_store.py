"""The controller state in Kubernetes: a ConfigMap holds the document, a Lease the leadership.

The backend for several controller replicas in a cluster; it keeps the contract of
`FileStateStore` (tests/controller/test_state_store.py runs both).

- The document is JSON under the data key `state.json` of the ConfigMap `<name>`. Its
  version is the ConfigMap's resourceVersion, and a write replaces the ConfigMap carrying
  the version it was decided on, so the API server's optimistic concurrency is the
  compare-and-swap: a stale version is answered 409 Conflict, raised here as StateConflict.
- The leader holds the coordination.k8s.io/v1 Lease `<name>-leader` (capstan/kube/lease.py).

It speaks JSON to the API server through capstan/kube/rest.py, not through the official
Kubernetes client, whose import alone would be most of a controller's start.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from capstan.common.errors import CapstanError
from capstan.controller.state_store import StateConflict, StateCorrupt, Versioned
from capstan.kube.holding import Holding as Lease
from capstan.kube.lease import (
    CONFLICT,
    NOT_FOUND,
    REQUEST_TIMEOUT_S,
    CoordinationLease,
    LeaseContended,
    LeaseMalformed,
    LeaseUnavailable,
    Object,
    call_api,
)
from capstan.kube.rest import KubeRest

STATE_KEY = "state.json"
LEASE_SUFFIX = "-leader"


class StateUnavailable(CapstanError):
    """The API server did not answer, or refused for a reason other than a conflict."""

    retriable = True


@contextmanager
def _as_state_errors() -> Iterator[None]:
    """The Lease's errors in the store's terms."""
    try:
        yield
    except LeaseUnavailable as exc:
        raise StateUnavailable(str(exc)) from exc
    except LeaseMalformed as exc:
        raise StateCorrupt(str(exc)) from exc
    except LeaseContended as exc:
        raise StateConflict(str(exc)) from exc


class KubernetesStateStore:
    """The state in ConfigMap `name`, the leadership in Lease `name`-leader, in `namespace`.

    `api` is a KubeRest, or an official client's ApiClient (its server and credentials)."""

    def __init__(
        self,
        api: KubeRest | Any,
        namespace: str,
        name: str,
        clock: Callable[[], float] = time.time,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._rest = api if isinstance(api, KubeRest) else KubeRest.from_api_client(api)
        self._lease = CoordinationLease(
            self._rest, namespace, name + LEASE_SUFFIX, clock, request_timeout_s=request_timeout_s
        )
        self._namespace = namespace
        self._name = name
        self._collection = f"/api/v1/namespaces/{namespace}/configmaps"
        self._path = f"{self._collection}/{name}"
        self._timeout_s = request_timeout_s
        self._state_at = f"configmap {namespace}/{name}"

    def _call(
        self,
        doing: str,
        tolerated: Collection[int],
        method: str,
        path: str,
        body: Object | None = None,
    ) -> Object | None:
        """`method path` on the API server; None when it answers a status in `tolerated`
        (a missing object, a lost race); StateUnavailable for any other failure."""
        return call_api(
            self._rest,
            doing,
            tolerated,
            method,
            path,
            body,
            timeout_s=self._timeout_s,
            unavailable=StateUnavailable,
        )

    # The document.

    def read(self) -> Versioned:
        config_map = self._call(f"reading {self._state_at}", (NOT_FOUND,), "GET", self._path)
        if config_map is None:
            return Versioned({}, "")
        return Versioned(self._document(config_map), self._version(config_map))

    def write(self, document: dict[str, Any], expected_version: str) -> str:
        metadata: Object = {"name": self._name, "namespace": self._namespace}
        if expected_version:
            metadata["resourceVersion"] = expected_version
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {STATE_KEY: json.dumps(document, sort_keys=True)},
        }
        if expected_version:
            stored = self._call(
                f"replacing {self._state_at}", (NOT_FOUND, CONFLICT), "PUT", self._path, body
            )
        else:
            stored = self._call(
                f"creating {self._state_at}", (CONFLICT,), "POST", self._collection, body
            )
        if stored is None:
            raise StateConflict(
                f"the controller state in {self._state_at} has moved on from version "
                f"{expected_version or 'none'}"
            )
        return self._version(stored)

    def _document(self, config_map: Mapping[str, Any]) -> dict[str, Any]:
        raw = (config_map.get("data") or {}).get(STATE_KEY)
        if raw is None:
            raise StateCorrupt(f"{self._state_at} has no data key {STATE_KEY}")
        try:
            document = json.loads(raw)
        except (TypeError, json.JSONDecodeError) as exc:
            raise StateCorrupt(f"{self._state_at} {STATE_KEY} is not valid JSON ({exc})") from exc
        if not isinstance(document, dict):
            raise StateCorrupt(
                f"{self._state_at} {STATE_KEY} holds {type(document).__name__}, not an object"
            )
        return document

    def _version(self, config_map: Mapping[str, Any]) -> str:
        version = (config_map.get("metadata") or {}).get("resourceVersion")
        if not version:
            raise StateCorrupt(f"{self._state_at} came back without a resourceVersion")
        return str(version)

    # The leadership.

    def try_lead(self, holder: str, duration_s: float) -> bool:
        with _as_state_errors():
            return self._lease.try_lead(holder, duration_s)

    def leader(self) -> Lease | None:
        with _as_state_errors():
            return self._lease.holding()

    def resign(self, holder: str) -> None:
        with _as_state_errors():
            self._lease.resign(holder)


def state_store_in_cluster(namespace: str, name: str) -> KubernetesStateStore:
    """The store in `namespace`'s ConfigMap and Lease `name`, reached with the pod's service
    account, else the kubeconfig (a controller run outside the cluster)."""
    rest = KubeRest.in_cluster() or KubeRest.from_kubeconfig()
    return KubernetesStateStore(rest, namespace, name)
