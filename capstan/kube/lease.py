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
from collections.abc import Callable, Collection, Mapping
from typing import Any

from capstan.common.errors import CapstanError
from capstan.kube.holding import Holding
from capstan.kube.rest import KubeRest, KubeStatusError, KubeUnreachable

REQUEST_TIMEOUT_S = 10.0
"""How long one API call may take before the API server is deemed unavailable."""
RESIGN_ATTEMPTS = 3
"""Conflicting writes a resignation outlasts before it gives up."""

NOT_FOUND = 404
CONFLICT = 409  # a stale resourceVersion ("Conflict") or a taken name ("AlreadyExists")

Object = dict[str, Any]
"""A Kubernetes object as the API server sends it (JSON)."""


class LeaseUnavailable(CapstanError):
    """The API server did not answer, or refused for a reason other than a conflict."""

    retriable = True


class LeaseMalformed(CapstanError):
    """The Lease says someone holds it but not until when."""


class LeaseContended(CapstanError):
    """The Lease kept changing while its holder gave it up."""


def call_api(
    rest: KubeRest,
    doing: str,
    tolerated: Collection[int],
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    unavailable: type[CapstanError] = LeaseUnavailable,
) -> Object | None:
    """`method path` on the API server; None when it answers a status in `tolerated` (a
    missing object, a lost race); `unavailable` (an exception class) for any other failure."""
    try:
        return rest.request(method, path, body, timeout_s=timeout_s)
    except KubeStatusError as exc:
        if exc.status in tolerated:
            return None
        raise unavailable(f"{doing}: the API server answered {exc}") from exc
    except KubeUnreachable as exc:
        raise unavailable(f"{doing}: no answer from the API server ({exc})") from exc


def micro_time(epoch_s: float) -> str:
    """`epoch_s` as a MicroTime, which the API server parses with the fixed layout
    2006-01-02T15:04:05.000000Z07:00 and refuses otherwise (400): six fractional digits."""
    moment = datetime.datetime.fromtimestamp(epoch_s, datetime.UTC)
    return moment.isoformat(timespec="microseconds")


def _epoch_s(stamp: Any, field: str, where: str) -> float:
    try:
        return datetime.datetime.fromisoformat(str(stamp)).timestamp()
    except ValueError as exc:
        raise LeaseMalformed(f"{where} has {field} {stamp!r}, not a time") from exc


def _holding_of(spec: Mapping[str, Any] | None, where: str) -> Holding | None:
    """Who `spec` says holds the Lease; None when nobody does."""
    if not spec or not spec.get("holderIdentity"):
        return None
    holder = str(spec["holderIdentity"])
    renewed, duration = spec.get("renewTime"), spec.get("leaseDurationSeconds")
    if renewed is None or duration is None:
        raise LeaseMalformed(
            f"{where} is held by {holder} but lacks renewTime or "
            "leaseDurationSeconds, so nobody can tell when it lapses"
        )
    if not isinstance(duration, int) or isinstance(duration, bool):
        raise LeaseMalformed(f"{where} has leaseDurationSeconds {duration!r}, not a number")
    return Holding(holder, _epoch_s(renewed, "renewTime", where), float(duration))


def _held(
    spec: Mapping[str, Any] | None, holder: str, duration_s: float, now_s: float, where: str
) -> Object:
    """`spec` once `holder` has taken or renewed the Lease at `now_s` for `duration_s`
    (any field this does not know kept as it was)."""
    kept = dict(spec or {})
    transitions = kept.get("leaseTransitions") or 0
    if kept.get("holderIdentity") == holder:  # a renewal
        acquired = kept.get("acquireTime")
        acquired_s = now_s if acquired is None else _epoch_s(acquired, "acquireTime", where)
    else:  # a new Lease, or a change of holder
        acquired_s = now_s
        transitions = 0 if spec is None else transitions + 1
    return {
        **kept,
        "holderIdentity": holder,
        "leaseDurationSeconds": math.ceil(duration_s),
        "acquireTime": micro_time(acquired_s),
        "renewTime": micro_time(now_s),
        "leaseTransitions": transitions,
    }


class CoordinationLease:
    """The Lease `name` in `namespace`."""

    def __init__(
        self,
        rest: KubeRest,
        namespace: str,
        name: str,
        clock: Callable[[], float] = time.time,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._rest = rest
        self._collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._path = f"{self._collection}/{name}"
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
            return self._create(_held(None, holder, duration_s, now_s, self.where))
        spec = current.get("spec")
        holding = _holding_of(spec, self.where)
        if holding is not None and holding.holder != holder and not holding.expired(now_s):
            return False
        current["spec"] = _held(spec, holder, duration_s, now_s, self.where)
        return self._replace(current)

    def holding(self) -> Holding | None:
        """Who holds the Lease now; None when nobody does or the last holding lapsed."""
        current = self._read()
        holding = _holding_of(current.get("spec") if current else None, self.where)
        if holding is None or holding.expired(self._clock()):
            return None
        return holding

    def resign(self, holder: str) -> None:
        """Give the Lease up at once (another takes it without waiting for it to lapse);
        nothing when `holder` does not hold it."""
        for _ in range(RESIGN_ATTEMPTS):
            current = self._read()
            spec = current.get("spec") if current else None
            if current is None or not spec or spec.get("holderIdentity") != holder:
                return
            # The rest as read: the times in the server's own MicroTime layout.
            current["spec"] = {k: v for k, v in spec.items() if k != "holderIdentity"}
            if self._replace(current):
                return
        raise LeaseContended(f"{self.where} kept changing while {holder} resigned")

    def _call(
        self,
        doing: str,
        tolerated: Collection[int],
        method: str,
        path: str,
        body: Object | None = None,
    ) -> Object | None:
        return call_api(self._rest, doing, tolerated, method, path, body, timeout_s=self._timeout_s)

    def _read(self) -> Object | None:
        return self._call(f"reading {self.where}", (NOT_FOUND,), "GET", self._path)

    def _create(self, spec: Object) -> bool:
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self._name, "namespace": self._namespace},
            "spec": spec,
        }
        created = self._call(f"creating {self.where}", (CONFLICT,), "POST", self._collection, lease)
        return created is not None

    def _replace(self, lease: Object) -> bool:
        """Write back `lease` as read and changed (its resourceVersion the read's); False if
        it changed or went meanwhile."""
        replaced = self._call(
            f"replacing {self.where}", (NOT_FOUND, CONFLICT), "PUT", self._path, lease
        )
        return replaced is not None
