"""Queue allocation strategies for clustering consumers: pure functions of the group's
sorted queues and sorted client ids (and, for the sticky one, the previous owners).

Every member of a group runs the same function over the same inputs and takes its own
share, so the members agree without talking to each other. Each strategy returns the whole
assignment: client id -> its queues, in queue order; every queue has exactly one owner.

- `allocate_averagely`: RocketMQ's default. Contiguous runs of queues; the first
  `len(queues) % len(clients)` clients get one more.
- `allocate_averagely_by_circle`: queue i goes to client i mod n.
- `allocate_consistent_hash`: queues and virtual nodes (several per client) on a hash
  ring; a queue belongs to the first node at or after its hash. A member joining or leaving
  moves only the queues it takes or held, but shares are uneven.
- `allocate_sticky`: balanced like `averagely` (shares differ by at most one) while keeping
  every queue with its previous owner where balance allows, so a membership change moves
  the fewest queues any balanced assignment could.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Protocol, TypeVar


class _Sortable(Hashable, Protocol):
    def __lt__(self, other: object, /) -> bool: ...


Q = TypeVar("Q", bound=_Sortable)

Assignment = dict[str, list[Q]]
"""client id -> the queues it owns, in queue order."""

DEFAULT_VIRTUAL_NODES = 10
"""Virtual nodes per client on the consistent-hash ring (RocketMQ's default)."""


def _inputs(queues: Sequence[Q], clients: Sequence[str]) -> tuple[list[Q], list[str]]:
    if len(set(clients)) != len(clients):
        raise ValueError("client ids must be unique")
    if len(set(queues)) != len(queues):
        raise ValueError("queues must be unique")
    return sorted(queues), sorted(clients)


def allocate_averagely(queues: Sequence[Q], clients: Sequence[str]) -> Assignment[Q]:
    qs, cs = _inputs(queues, clients)
    result: Assignment[Q] = {c: [] for c in cs}
    if not cs:
        return result
    share, extra = divmod(len(qs), len(cs))
    start = 0
    for index, client in enumerate(cs):
        size = share + (1 if index < extra else 0)
        result[client] = qs[start : start + size]
        start += size
    return result


def allocate_averagely_by_circle(queues: Sequence[Q], clients: Sequence[str]) -> Assignment[Q]:
    qs, cs = _inputs(queues, clients)
    result: Assignment[Q] = {c: [] for c in cs}
    for index, queue in enumerate(qs):
        if cs:
            result[cs[index % len(cs)]].append(queue)
    return result


def ring_hash(key: str) -> int:
    """The ring position of a key: the first 4 bytes of its MD5, as RocketMQ's MD5Hash."""
    return int.from_bytes(hashlib.md5(key.encode(), usedforsecurity=False).digest()[:4], "big")


def allocate_consistent_hash(
    queues: Sequence[Q],
    clients: Sequence[str],
    virtual_nodes: int = DEFAULT_VIRTUAL_NODES,
    queue_key: Callable[[Q], str] = str,
) -> Assignment[Q]:
    if virtual_nodes < 1:
        raise ValueError("virtual_nodes must be at least 1")
    qs, cs = _inputs(queues, clients)
    result: Assignment[Q] = {c: [] for c in cs}
    if not cs:
        return result
    ring = sorted((ring_hash(f"{c}-{n}"), c) for c in cs for n in range(virtual_nodes))
    points = [point for point, _ in ring]
    for queue in qs:
        at = bisect.bisect_left(points, ring_hash(queue_key(queue)))
        result[ring[at % len(ring)][1]].append(queue)
    return result


def allocate_sticky(
    queues: Sequence[Q], clients: Sequence[str], previous: Mapping[Q, str]
) -> Assignment[Q]:
    """Balanced, moving as few queues as possible from `previous` (queue -> last owner;
    owners no longer in `clients`, and queues no longer in `queues`, are ignored)."""
    qs, cs = _inputs(queues, clients)
    result: Assignment[Q] = {c: [] for c in cs}
    if not cs:
        return result
    held: dict[str, list[Q]] = {c: [] for c in cs}
    for queue in qs:
        owner = previous.get(queue)
        if owner in held:
            held[owner].append(queue)
    share, extra = divmod(len(qs), len(cs))
    # The `extra` larger shares go to the clients holding the most, which keeps the most.
    by_holding = sorted(cs, key=lambda c: (-len(held[c]), c))
    quota = {c: share + (1 if rank < extra else 0) for rank, c in enumerate(by_holding)}
    free: list[Q] = [q for q in qs if previous.get(q) not in held]
    for client in cs:
        kept = held[client][: quota[client]]
        result[client] = kept
        free.extend(held[client][quota[client] :])
    free.sort()
    for client in cs:
        room = quota[client] - len(result[client])
        if room > 0:
            result[client].extend(free[:room])
            del free[:room]
        result[client].sort()
    return result


def owners(assignment: Mapping[str, Sequence[Q]]) -> dict[Q, str]:
    """queue -> owner, from an assignment."""
    return {q: client for client, qs in assignment.items() for q in qs}
