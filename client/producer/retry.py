"""Where and when a failed send is tried again: pure decisions, tested on their own.

A retriable failure (the broker unreachable, busy, or timing out) is retried up to the
producer's `max_attempts` in total. Each retry goes to a queue of another broker group
when the topic has one, leaving out every group that has failed this send, so one dead
broker costs a send one extra round trip and no more. FIFO messages are the exception: a
message group must stay on its queue to stay in order, so they retry where they were; so
do keyed messages of a compact topic, whose key has one queue.
A failure that is not retriable is raised at once.
"""

from __future__ import annotations

from capstan.client.route import RouteQueue

INITIAL_BACKOFF_S = 0.01
MAX_BACKOFF_S = 1.0
"""Pause before retrying on the same broker: 10 ms, doubling, at most 1 s (what the
broker's Telemetry settings advise producers). Moving to another broker needs none."""


def queues_for_attempt(writable: list[RouteQueue], failed_brokers: set[str]) -> list[RouteQueue]:
    """The queues an attempt may use: those of broker groups that have not failed this
    send, or every writable queue when all of them have."""
    others = [q for q in writable if q.broker_name not in failed_brokers]
    return others or writable


def should_retry(
    retriable: bool, attempts_made: int, max_attempts: int, window_left_s: float = 0.0
) -> bool:
    """Whether to try again: a retriable failure, with attempts left or, past them, time
    left in the producer's retry window."""
    return retriable and (attempts_made < max_attempts or window_left_s > 0)


def backoff_s(attempts_made: int, same_broker: bool) -> float:
    """How long to wait before the next attempt."""
    if not same_broker:
        return 0.0
    return min(INITIAL_BACKOFF_S * 2.0 ** (attempts_made - 1), MAX_BACKOFF_S)
