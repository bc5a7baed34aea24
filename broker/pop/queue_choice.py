"""Pure decisions of a receive: which queues it looks at, in what order, and when a queue
with messages in flight can hand something out again.

A receive may be served from any queue of the topic on this broker, whichever queue the
client named (RocketMQ 5's proxy uses the named queue only to pick the broker); the
official clients name each queue of the route in turn, so serving only the named one
would make a receive aimed at an empty queue wait out its long polling while others hold
messages.
"""

from __future__ import annotations

from capstan.broker.pop.pop_state import QueuePop


def queue_order(count: int, start: int) -> list[int]:
    """Each of `count` queues once, from `start` round."""
    if count <= 0:
        return []
    return [(start + i) % count for i in range(count)]


def next_start(count: int, start: int, last_served: int | None) -> int:
    """Where a group's next receive starts: just after the last queue this receive took
    messages from, so the queues holding messages take turns however many empty queues
    lie between them; one further on when it found nothing."""
    if count <= 0:
        return 0
    return ((start if last_served is None else last_served) + 1) % count


def redeliverable_at(q: QueuePop, fifo: bool, limit: int, now_ms: int) -> int | None:
    """When something `q` holds in flight may be handed out again, in epoch milliseconds;
    None when time alone will not do it (a message past `limit` deliveries waits for the
    revive to dead-letter it, which wakes receives itself).

    A FIFO queue hands out again only once nothing of it is invisible any more; any other
    queue as soon as its first message comes due."""
    if not q.inflight:
        return None
    if not fifo and q.next_due_ms > now_ms:
        return q.next_due_ms  # a lower bound: waking early costs one more look
    live = [e.visible_at_ms for e in q.inflight.values() if e.attempt < limit]
    if not fifo:
        return min(live, default=None)
    return max(live) if len(live) == len(q.inflight) else None
