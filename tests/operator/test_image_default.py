"""The brokers' image: a group naming none runs the operator's (the chart's image and tag), so
an operator upgrade rolls it; one naming an image keeps it; a stored group holding the CRD's
old default is moved onto the operator's once (operator/image_default.py). The move on a
real API server with the real operator: tests/operator/test_operator_on_the_api_server.py."""

from __future__ import annotations

from typing import Any

from capstan.operator.image_default import (
    HANDLED_BEFORE,
    LEGACY_DEFAULT_IMAGE,
    MIGRATED,
    ImageMove,
    image_move,
)
from capstan.operator.manifests.broker_group import BrokerGroupManifests
from tests.operator.test_manifests import NEW, body


def test_a_group_naming_no_image_runs_the_operators_and_one_naming_an_image_keeps_it() -> None:
    def image(spec: dict[str, Any], operator_image: str) -> str:
        m = BrokerGroupManifests(body(spec), NEW, default_image=operator_image)
        return str(m.stateful_set()["spec"]["template"]["spec"]["containers"][0]["image"])

    unpinned = {"replicas": 3}
    assert image(unpinned, "registry.example/capstan:1.2.0") == "registry.example/capstan:1.2.0"
    assert image(unpinned, "registry.example/capstan:1.3.0") == "registry.example/capstan:1.3.0"
    pinned = {"replicas": 3, "image": "registry.example/capstan:1.1.0"}
    assert image(pinned, "registry.example/capstan:1.3.0") == "registry.example/capstan:1.1.0"


def test_only_a_group_an_older_operator_handled_holding_the_old_default_loses_it_once() -> None:
    def group(image: str | None, *annotations: str) -> dict[str, Any]:
        spec = {"replicas": 3} | ({"image": image} if image else {})
        marks = dict.fromkeys(annotations, "x")
        return {"metadata": {"name": "g", "annotations": marks}, "spec": spec}

    stored = image_move(group(LEGACY_DEFAULT_IMAGE, HANDLED_BEFORE))
    assert stored.mark and stored.drop_image and LEGACY_DEFAULT_IMAGE in stored.message
    # Met first by this operator (created now): a choice, kept.
    assert image_move(group(LEGACY_DEFAULT_IMAGE)) == ImageMove(True, False)
    assert image_move(group("registry.example/capstan:1.1.0", HANDLED_BEFORE)) == ImageMove(
        True, False
    )
    assert image_move(group(None, HANDLED_BEFORE)) == ImageMove(True, False)
    # Looked at once: a marked group is left as it is.
    marked = group(LEGACY_DEFAULT_IMAGE, HANDLED_BEFORE, MIGRATED)
    assert image_move(marked) == ImageMove(False, False)
