"""Growing a BrokerGroup's claims: sizes compared as bytes, a claim grown only when bound
and its class allows it, a class that does not named in Degraded, a shrink refused."""

from __future__ import annotations

import pytest

from capstan.operator import resource_rules
from capstan.operator.quantity import QuantityError, size_in_bytes
from capstan.operator.storage_growth import Claim, plan, status_of


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10Gi", 10 * 2**30),
        ("1.5Ti", 3 * 2**39),
        ("500M", 500 * 10**6),
        ("2k", 2000),
        ("1024", 1024),
        ("0.5Ki", 512),
        ("1.0001k", 1001),  # rounded up to a whole byte
    ],
)
def test_storage_sizes_are_bytes(text: str, expected: int) -> None:
    assert size_in_bytes(text) == expected


def test_a_size_that_is_no_quantity_is_refused_by_name() -> None:
    with pytest.raises(QuantityError, match="'lots' is not a storage size"):
        size_in_bytes("lots")
    assert size_in_bytes("1Gi") > size_in_bytes("1G") > size_in_bytes("953Mi")


def claim(name: str, requested: str, capacity: str = "", bound: bool = True, cls: str = "fast"):
    return Claim(name, requested, capacity or (requested if bound else ""), bound, cls)


def test_bound_claims_of_an_expandable_class_grow_and_are_resizing_until_their_capacity_is() -> (
    None
):
    claims = [
        claim("data-g-0", "10Gi"),
        claim("data-g-1", "20Gi", "10Gi"),  # asked already; the volume not yet grown
        claim("data-g-2", "10Gi", bound=False),  # its pod has not bound it yet
    ]
    step = plan("20Gi", claims, {"fast": True})
    assert step.grow == ("data-g-0",)
    assert set(step.resizing) == {"data-g-0", "data-g-1", "data-g-2"}
    assert not step.problem and not step.done
    grown = [claim(f"data-g-{i}", "20Gi") for i in range(3)]
    assert plan("20Gi", grown, {"fast": True}).done
    assert plan("20Gi", grown, {}).done  # nothing to grow: the class does not matter
    assert status_of("20Gi", grown, plan("20Gi", grown, {}))["ready"] is True


def test_a_class_that_does_not_allow_expansion_is_named_and_nothing_grows() -> None:
    claims = [claim("data-g-0", "10Gi", cls="local"), claim("data-g-1", "10Gi", cls="fast")]
    step = plan("20Gi", claims, {"fast": True, "local": False})
    assert step.grow == ()
    assert step.problem == (
        "the StorageClass local does not allow volume expansion (allowVolumeExpansion), so "
        "data-g-0 cannot grow to 20Gi"
    )
    unknown = plan("20Gi", [claim("data-g-0", "10Gi", cls="")], {})
    assert "StorageClass (none)" in unknown.problem


def test_the_size_may_grow_the_class_may_not_change_and_nothing_shrinks() -> None:
    old = {"replicas": 1, "storage": {"size": "10Gi", "storageClassName": "fast"}}

    def errors(storage: dict[str, str]) -> list[str]:
        return [
            str(e) for e in resource_rules.broker_group_errors({**old, "storage": storage}, old)
        ]

    assert errors({"size": "20Gi", "storageClassName": "fast"}) == []
    assert errors({"size": "10240Mi", "storageClassName": "fast"}) == []  # the same size
    assert errors({"size": "9Gi", "storageClassName": "fast"}) == [
        "spec.storage.size: may only grow: a claim cannot shrink from 10Gi to 9Gi"
    ]
    assert errors({"size": "10Gi", "storageClassName": "slow"}) == [
        "spec.storage.storageClassName: storageClassName is immutable; create a new "
        "BrokerGroup to move to another class"
    ]
    # A size left out is the CRD's default, 10Gi.
    assert resource_rules.broker_group_errors(
        {"replicas": 1, "storage": {"size": "5Gi"}}, {"replicas": 1, "storage": {}}
    )
