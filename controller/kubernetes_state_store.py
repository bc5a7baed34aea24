"""The controller state in Kubernetes: a ConfigMap holds the document, a Lease the leadership.

The backend for several controller replicas in a cluster; it keeps the contract of
`FileStateStore` (tests/controller/test_state_store.py runs both).

- The document is JSON under the data key `state.json` of the ConfigMap `<name>`. Its
  version is the ConfigMap's resourceVersion, and a write replaces the ConfigMap carrying
  the version it was decided on, so the API server's optimistic concurrency is the
  compare-and-swap: a stale version is answered 409 Conflict, raised here as StateConflict.
- The leader holds the coordination.k8s.io/v1 Lease `<name>-leader` (capstan/kube/lease.py).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kubernetes import config
from kubernetes.client import ApiClient, CoreV1Api, V1ConfigMap, V1ObjectMeta

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
    call_api,
)

STATE_KEY = "state.json"
LEASE_SUFFIX = "-leader"

T = TypeVar("T")


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
    """The state in ConfigMap `name`, the leadership in Lease `name`-leader, in `namespace`."""

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str,
        name: str,
        clock: Callable[[], float] = time.time,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._core = CoreV1Api(api_client)
        self._lease = CoordinationLease(
            api_client, namespace, name + LEASE_SUFFIX, clock, request_timeout_s=request_timeout_s
        )
        self._namespace = namespace
        self._name = name
        self._timeout_s = request_timeout_s
        self._state_at = f"configmap {namespace}/{name}"

    def _call(
        self, doing: str, tolerated: Collection[int], method: Callable[..., T], *args: Any
    ) -> T | None:
        """`method(*args)` on the API server; None when it answers a status in `tolerated`
        (a missing object, a lost race); StateUnavailable for any other failure."""
        return call_api(
            doing, tolerated, method, *args, timeout_s=self._timeout_s, unavailable=StateUnavailable
        )

    # The document.

    def read(self) -> Versioned:
        config_map = self._call(
            f"reading {self._state_at}",
            (NOT_FOUND,),
            self._core.read_namespaced_config_map,
            self._name,
            self._namespace,
        )
        if config_map is None:
            return Versioned({}, "")
        return Versioned(self._document(config_map), self._version(config_map))

    def write(self, document: dict[str, Any], expected_version: str) -> str:
        body = V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=V1ObjectMeta(
                name=self._name,
                namespace=self._namespace,
                resource_version=expected_version or None,
            ),
            data={STATE_KEY: json.dumps(document, sort_keys=True)},
        )
        if expected_version:
            stored = self._call(
                f"replacing {self._state_at}",
                (NOT_FOUND, CONFLICT),
                self._core.replace_namespaced_config_map,
                self._name,
                self._namespace,
                body,
            )
        else:
            stored = self._call(
                f"creating {self._state_at}",
                (CONFLICT,),
                self._core.create_namespaced_config_map,
                self._namespace,
                body,
            )
        if stored is None:
            raise StateConflict(
                f"the controller state in {self._state_at} has moved on from version "
                f"{expected_version or 'none'}"
            )
        return self._version(stored)

    def _document(self, config_map: V1ConfigMap) -> dict[str, Any]:
        raw = (config_map.data or {}).get(STATE_KEY)
        if raw is None:
            raise StateCorrupt(f"{self._state_at} has no data key {STATE_KEY}")
        try:
            document = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise StateCorrupt(f"{self._state_at} {STATE_KEY} is not valid JSON ({exc})") from exc
        if not isinstance(document, dict):
            raise StateCorrupt(
                f"{self._state_at} {STATE_KEY} holds {type(document).__name__}, not an object"
            )
        return document

    def _version(self, config_map: V1ConfigMap) -> str:
        version = config_map.metadata.resource_version if config_map.metadata else None
        if not version:
            raise StateCorrupt(f"{self._state_at} came back without a resourceVersion")
        return version

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
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # KUBECONFIG as it is now (the library reads it once, when first imported).
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)  # type: ignore[no-untyped-call]
    return KubernetesStateStore(ApiClient(), namespace, name)
