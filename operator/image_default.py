"""Which image a BrokerGroup's brokers run, and the one-time move of stored groups onto it.

A group that names no `spec.image` runs the operator's own image (`capstan operator
--image`, which the chart sets to its image and tag), so `helm upgrade` to a new tag rolls
every such group onto it, one pod at a time (operator/roller.py). A group that names an
image stays on it.

Until session 44 the CRD defaulted `spec.image` to `capstan:0.1.0`, so every group stored
then looks pinned to that image though nobody chose it. The first time this operator
handles a group an older one handled before (Kopf's record of the last spec handled is
there, this module's mark is not), it removes `spec.image` when it holds exactly that old
default, says so in an Event, and marks the group (`MIGRATED`). A group it meets first
(created now) is only marked, so a choice of that same image is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LEGACY_DEFAULT_IMAGE = "capstan:0.1.0"
"""What crds/brokergroup.yaml defaulted spec.image to before the operator's image did."""

MIGRATED = "capstan.io/image-default"
"""Annotation on a group the operator has looked at for the old default (value "checked")."""

HANDLED_BEFORE = "kopf.zalando.org/last-handled-configuration"
"""Kopf's record of the spec an operator last handled (its default diff base): there on
every group an operator handled, before the MIGRATED mark existed too."""


@dataclass(frozen=True)
class ImageMove:
    mark: bool
    """Annotate the group with MIGRATED."""
    drop_image: bool
    """Remove spec.image: it holds the old CRD default."""

    @property
    def message(self) -> str:
        return (
            f"spec.image {LEGACY_DEFAULT_IMAGE} was the CRD's old default, not a choice: "
            "removed, so the group runs the operator's image and follows its upgrades"
        )


def image_move(body: Mapping[str, Any]) -> ImageMove:
    """What to change on `body` as the operator reconciles it."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if MIGRATED in annotations:
        return ImageMove(mark=False, drop_image=False)
    image = (body.get("spec") or {}).get("image")
    stored_before = HANDLED_BEFORE in annotations
    return ImageMove(mark=True, drop_image=stored_before and image == LEGACY_DEFAULT_IMAGE)
