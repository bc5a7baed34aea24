"""Tag subscriptions: `*` (or nothing) for every message, or tags joined by `||`."""

from __future__ import annotations

import re

CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
"""Characters no tag, key or message group may contain."""


def parse_tag_expression(text: str) -> set[str] | None:
    """The accepted tags, or None for every message; ValueError for a malformed one."""
    text = text.strip()
    if not text or text == "*":
        return None
    tags = {t.strip() for t in text.split("||")}
    if "" in tags or any(CONTROL_CHARACTERS.search(t) for t in tags):
        raise ValueError(f"bad tag expression {text!r}")
    return tags
