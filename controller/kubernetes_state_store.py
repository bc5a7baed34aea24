"""The controller state in Kubernetes: a ConfigMap holds the document, a Lease the leadership.

The backend for several controller replicas in a cluster; it keeps the contract of
`FileStateStore` (tests/controller/test_state_store.py runs both).

- The document is JSON under the data key `state.json` of the ConfigMap `<name>`. Its
  version is the ConfigMap's resourceVersion, and a write replaces the ConfigMap carrying
  the version it was decided on, so the API server's optimistic concurrency is the
  compare-and-swap: a stale version is answered 409 Conflict, raised here as StateConflict.
- The leader holds the coordination.k8s.io/v1 Lease `<name>-leader`, the object client-go's
  leader election uses, so `kubectl get lease` shows who leads. A candidate takes it when it
  is free, its own or lapsed, by a write at the resourceVersion it read: of two candidates
  racing for one lapsed lease, one wins and the other is told it lost.

Expiry is judged against renewTime by the caller's clock, so the replicas' clocks must agree
to well within a lease duration. leaseDurationSeconds holds whole seconds; a duration is
rounded up, never down, so no candidate deems a lease lapsed before its holder does.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import urllib3
from kubernetes import config
from kubernetes.client import (
    ApiClient,
    ApiException,
    CoordinationV1Api,
    CoreV1Api,
    V1ConfigMap,
    V1Lease,
    V1LeaseSpec,
    V1ObjectMeta,
)

from capstan.common.errors import CapstanError
from capstan.controller.state_store import Lease, StateConflict, StateCorrupt, Versioned

STATE_KEY = "state.json"
LEASE_SUFFIX = "-leader"
REQUEST_TIMEOUT_S = 10.0
"""How long one API call may take before the store calls the API server unavailable."""
RESIGN_ATTEMPTS = 3
"""Conflicting writes a resignation outlasts before it gives up."""

NOT_FOUND = 404
CONFLICT = 409  # a stale resourceVersion ("Conflict") or a taken name ("AlreadyExists")

T = TypeVar("T")


class StateUnavailable(CapstanError):
    """The API server did not answer, or refused for a reason other than a conflict."""

    retriable = True


class _MicroTime(datetime.datetime):
    """A time that the client serializes with six fractional digits.

    Lease times are MicroTime, which the API server parses with the fixed layout
    2006-01-02T15:04:05.000000Z07:00 and refuses otherwise (400). The client writes
    datetimes with isoformat(), which drops the fraction of a whole second."""

    def isoformat(self, sep: str = "T", timespec: str = "auto") -> str:
        return super().isoformat(sep, "microseconds")


def _micro_time(epoch_s: float) -> _MicroTime:
    return _MicroTime.fromtimestamp(epoch_s, datetime.UTC)


def _as_micro_time(moment: datetime.datetime | None) -> _MicroTime | None:
    return None if moment is None else _micro_time(moment.timestamp())


def _lease_of(spec: V1LeaseSpec | None, where: str) -> Lease | None:
    """The lease `spec` records; None when nobody holds it."""
    if spec is None or not spec.holder_identity:
        return None
    if spec.renew_time is None or spec.lease_duration_seconds is None:
        raise StateCorrupt(
            f"{where} is held by {spec.holder_identity} but lacks renewTime or "
            "leaseDurationSeconds, so nobody can tell when it lapses"
        )
    renewed_at_s = spec.renew_time.timestamp()
    return Lease(spec.holder_identity, renewed_at_s, float(spec.lease_duration_seconds))


def _held(spec: V1LeaseSpec | None, holder: str, duration_s: float, now_s: float) -> V1LeaseSpec:
    """`spec` once `holder` has taken or renewed the lease at `now_s` for `duration_s`."""
    if spec is not None and spec.holder_identity == holder:  # a renewal
        acquired_s = spec.acquire_time.timestamp() if spec.acquire_time else now_s
        transitions = spec.lease_transitions or 0
    else:  # a new lease, or a change of holder
        acquired_s = now_s
        transitions = 0 if spec is None else (spec.lease_transitions or 0) + 1
    return V1LeaseSpec(
        holder_identity=holder,
        lease_duration_seconds=math.ceil(duration_s),
        acquire_time=_micro_time(acquired_s),
        renew_time=_micro_time(now_s),
        lease_transitions=transitions,
    )


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
        self._coordination = CoordinationV1Api(api_client)
        self._namespace = namespace
        self._name = name
        self._lease_name = name + LEASE_SUFFIX
        self._clock = clock
        self._timeout_s = request_timeout_s
        self._state_at = f"configmap {namespace}/{name}"
        self._lease_at = f"lease {namespace}/{self._lease_name}"

    def _call(
        self, doing: str, tolerated: Collection[int], method: Callable[..., T], *args: Any
    ) -> T | None:
        """`method(*args)` on the API server; None when it answers a status in `tolerated`
        (a missing object, a lost race); StateUnavailable for any other failure."""
        try:
            return method(*args, _request_timeout=self._timeout_s)
        except ApiException as exc:
            if exc.status in tolerated:
                return None
            raise StateUnavailable(
                f"{doing}: the API server answered {exc.status} {exc.reason}"
            ) from exc
        except urllib3.exceptions.HTTPError as exc:
            raise StateUnavailable(f"{doing}: no answer from the API server ({exc})") from exc

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
        if not holder or duration_s <= 0:
            raise ValueError("a lease needs a holder and a positive duration")
        now_s = self._clock()
        current = self._read_lease()
        if current is None:
            return self._create_lease(_held(None, holder, duration_s, now_s))
        lease = _lease_of(current.spec, self._lease_at)
        if lease is not None and lease.holder != holder and not lease.expired(now_s):
            return False
        current.spec = _held(current.spec, holder, duration_s, now_s)
        return self._replace_lease(current)

    def leader(self) -> Lease | None:
        current = self._read_lease()
        lease = _lease_of(current.spec if current else None, self._lease_at)
        if lease is None or lease.expired(self._clock()):
            return None
        return lease

    def resign(self, holder: str) -> None:
        for _ in range(RESIGN_ATTEMPTS):
            current = self._read_lease()
            if current is None or current.spec is None or current.spec.holder_identity != holder:
                return
            spec = current.spec
            spec.holder_identity = None
            spec.acquire_time = _as_micro_time(spec.acquire_time)  # as read, they may lack
            spec.renew_time = _as_micro_time(spec.renew_time)  # the fraction the server needs
            if self._replace_lease(current):
                return
        raise StateConflict(f"{self._lease_at} kept changing while {holder} resigned")

    def _read_lease(self) -> V1Lease | None:
        return self._call(
            f"reading {self._lease_at}",
            (NOT_FOUND,),
            self._coordination.read_namespaced_lease,
            self._lease_name,
            self._namespace,
        )

    def _create_lease(self, spec: V1LeaseSpec) -> bool:
        lease = V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=V1ObjectMeta(name=self._lease_name, namespace=self._namespace),
            spec=spec,
        )
        created = self._call(
            f"creating {self._lease_at}",
            (CONFLICT,),
            self._coordination.create_namespaced_lease,
            self._namespace,
            lease,
        )
        return created is not None

    def _replace_lease(self, lease: V1Lease) -> bool:
        """Write back `lease` as read and changed; False if it changed or went meanwhile."""
        replaced = self._call(
            f"replacing {self._lease_at}",
            (NOT_FOUND, CONFLICT),
            self._coordination.replace_namespaced_lease,
            self._lease_name,
            self._namespace,
            lease,
        )
        return replaced is not None


def state_store_in_cluster(namespace: str, name: str) -> KubernetesStateStore:
    """The store in `namespace`'s ConfigMap and Lease `name`, reached with the pod's service
    account, else the kubeconfig (a controller run outside the cluster)."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        # KUBECONFIG as it is now (the library reads it once, when first imported).
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)  # type: ignore[no-untyped-call]
    return KubernetesStateStore(ApiClient(), namespace, name)
