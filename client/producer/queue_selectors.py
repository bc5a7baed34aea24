"""Which queue a message goes to.

A selector picks one of the topic's writable queues (sorted by broker name and queue id)
for a message. The producer calls it once per attempt, with the queues it may still use
(a retry leaves out the broker that just failed). Anything with a `select(queues, message)`
method is a selector, and so is a plain function of (queues, message).
"""

from __future__ import annotations

import itertools
import random
import threading
import zlib
from collections.abc import Callable
from typing import Protocol

from capstan.client.message import Message
from capstan.client.route import RouteQueue
from capstan.common.key_routing import queue_index, routing_key


class QueueSelector(Protocol):
    def select(self, queues: list[RouteQueue], message: Message) -> RouteQueue: ...


SelectorFunction = Callable[[list[RouteQueue], Message], RouteQueue]
Selector = QueueSelector | SelectorFunction


def stable_hash(key: str | bytes) -> int:
    """A hash every process computes alike (Python's own hash() of a str is salted per
    process, so it would send one key to different queues from different producers)."""
    return zlib.crc32(key.encode() if isinstance(key, str) else key)


class RoundRobin:
    """Each topic's queues in turn, starting at a random one (so many producers that start
    together do not all begin on the same queue); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, itertools.count[int]] = {}

    def select(self, queues: list[RouteQueue], message: Message) -> RouteQueue:
        with self._lock:
            counter = self._counters.get(message.topic)
            if counter is None:
                counter = self._counters[message.topic] = itertools.count(random.randrange(1024))
            n = next(counter)
        return queues[n % len(queues)]


def _group_or_first_key(message: Message) -> str | None:
    if message.message_group is not None:
        return message.message_group
    return message.keys[0] if message.keys else None


class ByKeyHash:
    """The queue at `stable_hash(key) mod len(queues)`, so one key always lands on one
    queue while the topic's queues stay the same. `key_fn` gives the key of a message (by
    default its message group, else its first key); a message without one goes round
    robin."""

    def __init__(self, key_fn: Callable[[Message], str | bytes | None] | None = None) -> None:
        self._key_fn = key_fn or _group_or_first_key
        self._fallback = RoundRobin()

    def select(self, queues: list[RouteQueue], message: Message) -> RouteQueue:
        key = self._key_fn(message)
        if key is None:
            return self._fallback.select(queues, message)
        return queues[stable_hash(key) % len(queues)]


def routed_by_key(queues: list[RouteQueue], message: Message) -> bool:
    """Whether `message` must go to its key's queue: a keyed message of a topic whose route
    says so (a compact topic, whose compaction looks for a key in one queue)."""
    return bool(message.keys) and message.message_group is None and queues[0].by_key


class DefaultSelector:
    """A message with a message group goes by the hash of its group (a group stays on one
    queue, in order); a keyed message of a compact topic by the hash of its keys
    (capstan/common/key_routing.py: the broker picks alike for clients that name no
    queue); any other goes round robin."""

    def __init__(self) -> None:
        self._round_robin = RoundRobin()

    def select(self, queues: list[RouteQueue], message: Message) -> RouteQueue:
        if message.message_group is not None:
            return queues[stable_hash(message.message_group) % len(queues)]
        if routed_by_key(queues, message):
            return queues[queue_index(routing_key(message.keys), len(queues))]
        return self._round_robin.select(queues, message)


class _FunctionSelector:
    def __init__(self, fn: SelectorFunction) -> None:
        self._fn = fn

    def select(self, queues: list[RouteQueue], message: Message) -> RouteQueue:
        return self._fn(queues, message)


def as_selector(selector: Selector) -> QueueSelector:
    """A selector object for anything the producer accepts as one."""
    if hasattr(selector, "select"):
        return selector
    if callable(selector):
        return _FunctionSelector(selector)
    raise TypeError(f"{selector!r} is neither a QueueSelector nor a function of (queues, message)")
