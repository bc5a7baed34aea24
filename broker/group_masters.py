"""Where another broker group's master is, for calls this broker makes to that group on a
client's behalf (a static topic's sends passed on, older items read for the leader).

The controller names each group's master (the controller link's `master_of`); an answer is
used for `ADDRESS_KEPT_S`, and forgotten at once when a call to it fails, so the next call
asks again.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

OLDER_ITEMS_FOR = "x-capstan-older-items-for"
"""Marks a call one group (named there) makes to another about a static topic's logic
queues they both hold items of (the fronting group reading older items, a group keeping
older items reaching the front, an order check): answered from what the called group
holds alone (its own committed offsets, its own messages, at once), never passed on."""
ADDRESS_KEPT_S = 2.0
"""How long a group's master address is used before the controller is asked again."""


class GroupMasters:
    def __init__(self, locate: Callable[[str], Awaitable[str]] | None) -> None:
        """`locate` names a group's master address; None for a broker without a
        controller, which cannot find another group."""
        self._locate = locate
        self._known: dict[str, tuple[str, float]] = {}

    async def address(self, group: str) -> str:
        """`group`'s master address, "" when none is known now."""
        known = self._known.get(group)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        if self._locate is None:
            return ""
        address = await self._locate(group)
        if address:
            self._known[group] = (address, time.monotonic() + ADDRESS_KEPT_S)
        return address

    def forget(self, group: str) -> None:
        """A call to `group`'s master failed: ask the controller next time."""
        self._known.pop(group, None)
