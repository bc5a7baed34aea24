"""Tag subscriptions: `*` (or nothing) for every message, or tags joined by `||`."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def parse_tag_expression(text: str) -> set[str] | None:
    """The accepted tags, or None for every message; ValueError for a malformed one."""
    text = text.strip()
    if not text or text == "*":
        return None
    tags = {t.strip() for t in text.split("||")}
    if "" in tags or any(_CONTROL.search(t) for t in tags):
        raise ValueError(f"bad tag expression {text!r}")
    return tags
