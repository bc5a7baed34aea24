"""Flow control of the PullMessageService with the default ConsumerOptions (seed 000): a
queue is put off only when its cache holds more than 1000 messages, more than 100 MiB or
(concurrent) spans more than 2000 offsets; exactly at a limit it is still pulled. A queue
put off is pulled again after 50 ms, and each hit counts by reason."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from capstan.client.consumer.message_queue import MessageQueue
from capstan.client.consumer.process_queue import ProcessQueue
from capstan.client.consumer.pull_service import (
    FLOW_CONTROL_DELAY_S,
    PullMessageService,
    PullRequest,
    flow_control_reason,
)
from capstan.client.consumer.settings import ConsumerOptions
from capstan.client.metrics import ConsumerMetrics
from tests.client.one_replica import OneReplica

DEFAULTS = ConsumerOptions()
MIB = 1024 * 1024
Q = MessageQueue("T", "broker-a", 0)


def test_the_defaults_are_the_seeds_limits():
    assert DEFAULTS.pull_threshold_for_queue == 1000
    assert DEFAULTS.pull_threshold_size_for_queue_mib == 100
    assert DEFAULTS.consume_concurrently_max_span == 2000
    assert FLOW_CONTROL_DELAY_S == 0.05


@pytest.mark.parametrize(
    ("count", "size_bytes", "span", "expected"),
    [
        (0, 0, 0, None),
        (1000, 0, 0, None),
        (1001, 0, 0, "count"),
        (0, 100 * MIB, 0, None),
        (0, 100 * MIB + 1, 0, "size"),
        (0, 0, 2000, None),
        (0, 0, 2001, "span"),
        (1000, 100 * MIB, 2000, None),  # every figure at its limit: still pulled
        (1001, 100 * MIB + 1, 2001, "count"),  # the first limit exceeded names the hit
        (1000, 100 * MIB + 1, 2001, "size"),
    ],
)
def test_a_limit_trips_only_when_exceeded(count, size_bytes, span, expected):
    assert flow_control_reason(count, size_bytes, span, DEFAULTS, orderly=False) == expected


def test_orderly_consumption_has_no_span_limit():
    assert flow_control_reason(0, 0, 10**9, DEFAULTS, orderly=True) is None
    assert flow_control_reason(1001, 0, 0, DEFAULTS, orderly=True) == "count"
    assert flow_control_reason(0, 100 * MIB + 1, 0, DEFAULTS, orderly=True) == "size"


# -- the pull loop applying the decision -------------------------------------------------


class Sized:
    """A message body that only has a length, so 100 MiB need not be allocated."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


@dataclass
class Cached:
    queue_offset: int
    body: Any = b"x"


class FakeCalls:
    """Records the pulls started; the answers never come (the test looks at one step)."""

    def __init__(self) -> None:
        self.pulls: list[int] = []

    def pull_future(self, address: str, queue: MessageQueue, offset: int, *rest: Any) -> Any:
        self.pulls.append(offset)
        return self

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        pass


class FakeScheduler:
    def __init__(self) -> None:
        self.later: list[float] = []

    def call_later(self, delay_s: float, job: Callable[[], None]) -> None:
        self.later.append(delay_s)


def one_pull(cached: list[Cached]) -> tuple[FakeCalls, FakeScheduler, dict[str, float]]:
    """Run one step of the pull loop on a queue caching `cached`."""
    calls, scheduler = FakeCalls(), FakeScheduler()
    metrics = ConsumerMetrics("G", "client")
    service = PullMessageService(
        calls,  # type: ignore[arg-type]
        OneReplica(),
        DEFAULTS,
        None,  # type: ignore[arg-type]  # not reached by a pull that is only started
        metrics,
        scheduler,  # type: ignore[arg-type]
        lambda *a: None,
        lambda q: None,
        orderly=False,
    )
    pq: ProcessQueue[Any] = ProcessQueue()
    pq.put(cached)
    service._pull(PullRequest(Q, pq, 5000, "*"))
    hits = {
        s.labels["reason"]: s.value
        for m in metrics.registry.collect()
        if m.name == "capstan_flow_control"
        for s in m.samples
        if s.name.endswith("_total")
    }
    return calls, scheduler, hits


@pytest.mark.parametrize(
    ("at_limit", "over_limit", "reason"),
    [
        (
            [Cached(i) for i in range(1000)],
            [Cached(i) for i in range(1001)],
            "count",
        ),
        (
            [Cached(0, Sized(100 * MIB))],
            [Cached(0, Sized(100 * MIB)), Cached(1)],
            "size",
        ),
        ([Cached(0), Cached(2000)], [Cached(0), Cached(2001)], "span"),
    ],
    ids=["count", "size", "span"],
)
def test_the_pull_loop_puts_a_queue_off_50_ms_past_a_limit(at_limit, over_limit, reason):
    calls, scheduler, hits = one_pull(at_limit)
    assert calls.pulls == [5000]  # pulled from its next offset at once
    assert scheduler.later == []
    assert hits == {}
    calls, scheduler, hits = one_pull(over_limit)
    assert calls.pulls == []  # not pulled now...
    assert scheduler.later == [0.05]  # ...but again after 50 ms
    assert hits == {reason: 1.0}
