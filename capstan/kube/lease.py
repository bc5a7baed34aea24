"""Leadership by a coordination.k8s.io/v1 Lease, the object client-go's leader election uses,
so `kubectl get lease` shows who leads. The controller's replicas and the operator's each
elect their leader by one.

A candidate takes the Lease when it is free, its own or lapsed, by a write at the
resourceVersion it read: of two candidates racing for one lapsed Lease, one wins and the
other is told it lost. Expiry is judged against renewTime by the caller's clock, so the
candidates' clocks must agree to well within a lease duration. leaseDurationSeconds holds
whole seconds; a duration is rounded up, never down, so no candidate deems a Lease lapsed
before its holder does.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import urllib3
from kubernetes.client import (
    ApiClient,
    ApiException,
    CoordinationV1Api,
    V1Lease,
    V1LeaseSpec,
    V1ObjectMeta,
)

from capstan.common.errors import CapstanError
from capstan.kube.holding import Holding

REQUEST_TIMEOUT_S = 10.0
"""How long one API call may take before the API server is deemed unavailable."""
RESIGN_ATTEMPTS = 3
"""Conflicting writes a resignation outlasts before it gives up."""

NOT_FOUND = 404
CONFLICT = 409  # a stale resourceVersion ("Conflict") or a taken name ("AlreadyExists")

T = TypeVar("T")


class LeaseUnavailable(CapstanError):
    """The API server did not answer, or refused for a reason other than a conflict."""

    retriable = True


class LeaseMalformed(CapstanError):
    """The Lease says someone holds it but not until when."""


class LeaseContended(CapstanError):
    """The Lease kept changing while its holder gave it up."""


def call_api(
    doing: str,
    tolerated: Collection[int],
    method: Callable[..., T],
    *args: Any,
    timeout_s: float = REQUEST_TIMEOUT_S,
    unavailable: type[CapstanError] = LeaseUnavailable,
) -> T | None:
    """`method(*args)` on the API server; None when it answers a status in `tolerated` (a
    missing object, a lost race); `unavailable` (an exception class) for any other failure."""
    try:
        return method(*args, _request_timeout=timeout_s)
    except ApiException as exc:
        if exc.status in tolerated:
            return None
        raise unavailable(f"{doing}: the API server answered {exc.status} {exc.reason}") from exc
    except urllib3.exceptions.HTTPError as exc:
        raise unavailable(f"{doing}: no answer from the API server ({exc})") from exc


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


def _holding_of(spec: V1LeaseSpec | None, where: str) -> Holding | None:
    """Who `spec` says holds the Lease; None when nobody does."""
    if spec is None or not spec.holder_identity:
        return None
    if spec.renew_time is None or spec.lease_duration_seconds is None:
        raise LeaseMalformed(
            f"{where} is held by {spec.holder_identity} but lacks renewTime or "
            "leaseDurationSeconds, so nobody can tell when it lapses"
        )
    renewed_at_s = spec.renew_time.timestamp()
    return Holding(spec.holder_identity, renewed_at_s, float(spec.lease_duration_seconds))


def _held(spec: V1LeaseSpec | None, holder: str, duration_s: float, now_s: float) -> V1LeaseSpec:
    """`spec` once `holder` has taken or renewed the Lease at `now_s` for `duration_s`."""
    if spec is not None and spec.holder_identity == holder:  # a renewal
        acquired_s = spec.acquire_time.timestamp() if spec.acquire_time else now_s
        transitions = spec.lease_transitions or 0
    else:  # a new Lease, or a change of holder
        acquired_s = now_s
        transitions = 0 if spec is None else (spec.lease_transitions or 0) + 1
    return V1LeaseSpec(
        holder_identity=holder,
        lease_duration_seconds=math.ceil(duration_s),
        acquire_time=_micro_time(acquired_s),
        renew_time=_micro_time(now_s),
        lease_transitions=transitions,
    )


class CoordinationLease:
    """The Lease `name` in `namespace`."""

    def __init__(
        self,
        api_client: ApiClient,
        namespace: str,
        name: str,
        clock: Callable[[], float] = time.time,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._api = CoordinationV1Api(api_client)
        self._namespace = namespace
        self._name = name
        self._clock = clock
        self._timeout_s = request_timeout_s
        self.where = f"lease {namespace}/{name}"

    def try_lead(self, holder: str, duration_s: float) -> bool:
        """Take or renew the Lease for `duration_s`; False while another holds it."""
        if not holder or duration_s <= 0:
            raise ValueError("a lease needs a holder and a positive duration")
        now_s = self._clock()
        current = self._read()
        if current is None:
            return self._create(_held(None, holder, duration_s, now_s))
        holding = _holding_of(current.spec, self.where)
        if holding is not None and holding.holder != holder and not holding.expired(now_s):
            return False
        current.spec = _held(current.spec, holder, duration_s, now_s)
        return self._replace(current)

    def holding(self) -> Holding | None:
        """Who holds the Lease now; None when nobody does or the last holding lapsed."""
        current = self._read()
        holding = _holding_of(current.spec if current else None, self.where)
        if holding is None or holding.expired(self._clock()):
            return None
        return holding

    def resign(self, holder: str) -> None:
        """Give the Lease up at once (another takes it without waiting for it to lapse);
        nothing when `holder` does not hold it."""
        for _ in range(RESIGN_ATTEMPTS):
            current = self._read()
            if current is None or current.spec is None or current.spec.holder_identity != holder:
                return
            spec = current.spec
            spec.holder_identity = None
            spec.acquire_time = _as_micro_time(spec.acquire_time)  # as read, they may lack
            spec.renew_time = _as_micro_time(spec.renew_time)  # the fraction the server needs
            if self._replace(current):
                return
        raise LeaseContended(f"{self.where} kept changing while {holder} resigned")

    def _call(
        self, doing: str, tolerated: Collection[int], method: Callable[..., T], *args: Any
    ) -> T | None:
        return call_api(doing, tolerated, method, *args, timeout_s=self._timeout_s)

    def _read(self) -> V1Lease | None:
        return self._call(
            f"reading {self.where}",
            (NOT_FOUND,),
            self._api.read_namespaced_lease,
            self._name,
            self._namespace,
        )

    def _create(self, spec: V1LeaseSpec) -> bool:
        lease = V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=V1ObjectMeta(name=self._name, namespace=self._namespace),
            spec=spec,
        )
        created = self._call(
            f"creating {self.where}",
            (CONFLICT,),
            self._api.create_namespaced_lease,
            self._namespace,
            lease,
        )
        return created is not None

    def _replace(self, lease: V1Lease) -> bool:
        """Write back `lease` as read and changed; False if it changed or went meanwhile."""
        replaced = self._call(
            f"replacing {self.where}",
            (NOT_FOUND, CONFLICT),
            self._api.replace_namespaced_lease,
            self._name,
            self._namespace,
            lease,
        )
        return replaced is not None
