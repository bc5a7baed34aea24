"""Flushing: group commit for SYNC_FLUSH, the interval for ASYNC_FLUSH, timeouts, the asyncio
appender, and closing with writes in flight."""

from __future__ import annotations

import asyncio
import errno
import pathlib
import threading
import time
from collections.abc import Callable

import pytest

from capstan.broker.store.async_append import AsyncAppender
from capstan.broker.store.commitlog import CommitLog
from capstan.broker.store.flush import CommitLogFlusher
from capstan.broker.store.message import Message, StoredMessage
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.status import GetStatus, PutResult, PutStatus
from capstan.common.store_settings import FlushMode

from .conftest import SEGMENT_BYTES, TOPIC, make_message, open_store


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def end_of(result: PutResult) -> int:
    last = result.appended[-1]
    return last.phys_offset + last.size


def read_queue(store: MessageStore, queue_id: int) -> list[StoredMessage]:
    messages: list[StoredMessage] = []
    offset = 0
    while (got := store.get(TOPIC, queue_id, offset)).status is GetStatus.FOUND:
        messages += got.messages
        offset = got.next_begin_offset
    assert got.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)
    return messages


Put = tuple[int, PutResult, int]
"""(message number, its put result, the CommitLog's flushed offset when the put returned)"""


class HungDisk:
    """CommitLog fsyncs block until `release()` (or the with-block ends): a disk that stopped
    answering. `entered` is set once the flush thread is stuck inside one."""

    def __init__(self, commitlog: CommitLog) -> None:
        self._commitlog = commitlog
        self._real_sync = commitlog.sync
        self._released = threading.Event()
        self.entered = threading.Event()

    def _sync(self) -> int:
        self.entered.set()
        self._released.wait(30)
        return self._real_sync()

    def release(self) -> None:
        self._released.set()

    def __enter__(self) -> HungDisk:
        self._commitlog.sync = self._sync  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        del self._commitlog.sync


class HeldFlusherLock:
    """Another thread holds the flusher's condition lock until the with-block ends."""

    def __init__(self, flusher: CommitLogFlusher) -> None:
        self._flusher = flusher
        self._held = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="holds-flusher-lock")

    def _hold(self) -> None:
        with self._flusher._cond:
            self._held.set()
            self._done.wait(30)

    def __enter__(self) -> HeldFlusherLock:
        self._thread.start()
        assert self._held.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(10)


# -- SYNC_FLUSH ---------------------------------------------------------------------------


def test_group_commit_serves_many_concurrent_writers_with_few_fsyncs(
    tmp_path: pathlib.Path,
) -> None:
    writers, puts_each = 16, 50
    with open_store(tmp_path / "store") as store:
        before = store.flusher.fsync_count
        start = threading.Barrier(writers)
        seen: list[list[tuple[PutResult, int]]] = [[] for _ in range(writers)]

        def writer(t: int) -> None:
            start.wait()
            for j in range(puts_each):
                result = store.put([make_message(t * puts_each + j, queue_id=t % 4, size=200)])
                seen[t].append((result, store.commitlog.flushed_offset))

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(writers)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(30)

        results = [r for per_writer in seen for r, _ in per_writer]
        assert len(results) == writers * puts_each
        assert {r.status for r in results} == {PutStatus.PUT_OK}
        fsyncs = store.flusher.fsync_count - before
        assert 0 < fsyncs < writers * puts_each
        assert store.commitlog.flushed_offset == store.commitlog.write_offset
        for per_writer in seen:
            assert all(durable >= end_of(r) for r, durable in per_writer)
            offsets = [r.appended[0].queue_offset for r, _ in per_writer]
            assert offsets == sorted(set(offsets))
        for q in range(4):
            got = read_queue(store, q)
            assert [m.queue_offset for m in got] == list(range(writers // 4 * puts_each))


def test_a_sync_writer_is_answered_only_once_durable_and_one_fsync_answers_all_waiting(
    tmp_path: pathlib.Path,
) -> None:
    with open_store(tmp_path / "store", flush_disk_timeout_ms=20_000) as store:
        answers: dict[int, tuple[PutResult, int]] = {}

        def writer(i: int) -> None:
            result = store.put([make_message(i, queue_id=i % 4)])
            answers[i] = (result, store.commitlog.flushed_offset)

        with HungDisk(store.commitlog) as disk:
            first = threading.Thread(target=writer, args=(0,))
            first.start()
            assert disk.entered.wait(5)  # writer 0's fsync has started and hangs
            others = [threading.Thread(target=writer, args=(i,)) for i in range(1, 16)]
            for th in others:
                th.start()
            # every other writer has appended and is waiting for the flusher
            assert wait_until(lambda: len(store.flusher._pending) == 15)
            assert answers == {}
            assert store.commitlog.flushed_offset == 0
            before = store.flusher.fsync_count
            disk.release()
            for th in [first, *others]:
                th.join(10)

        assert sorted(answers) == list(range(16))
        for result, durable in answers.values():
            assert result.status is PutStatus.PUT_OK
            assert durable >= end_of(result)
        # the hung fsync, then one more that answers all fifteen waiting writers
        assert store.flusher.fsync_count - before == 2


def test_a_hung_fsync_answers_flush_disk_timeout_and_the_message_is_kept(
    tmp_path: pathlib.Path,
) -> None:
    with open_store(tmp_path / "store", flush_disk_timeout_ms=1_000) as store:
        with HungDisk(store.commitlog):
            result = store.put([make_message(1, queue_id=2)])
            assert result.status is PutStatus.FLUSH_DISK_TIMEOUT
            assert result.status.retriable and result.detail
            [appended] = result.appended  # written, just not known durable
            assert appended.queue_offset == 0
            assert store.commitlog.flushed_offset < end_of(result)
            got = store.get(TOPIC, 2, 0)
            assert got.status is GetStatus.FOUND
            assert [m.body for m in got.messages] == [make_message(1).body]
        assert wait_until(lambda: store.commitlog.flushed_offset >= end_of(result))
        after = store.put([make_message(2, queue_id=2)])
        assert after.status is PutStatus.PUT_OK
        assert after.appended[0].queue_offset == 1


def test_a_failed_fsync_answers_io_error_and_stops_acknowledging(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    store = open_store(root)
    try:
        assert store.put([make_message(0)]).status is PutStatus.PUT_OK

        def broken_sync() -> int:
            raise OSError(errno.EIO, "simulated I/O error")

        store.commitlog.sync = broken_sync  # type: ignore[method-assign]
        failed = store.put([make_message(1)])
        assert failed.status is PutStatus.IO_ERROR
        assert not failed.status.retriable
        assert not store.healthy
        end = store.commitlog.write_offset
        refused = store.put([make_message(2)])
        assert (refused.status, refused.appended) == (PutStatus.IO_ERROR, [])
        assert store.commitlog.write_offset == end
    finally:
        store.close()
    with open_store(root) as store:
        assert store.recovery.crashed  # a store that lost an fsync is not marked clean
        assert [m.body for m in read_queue(store, 0)][:1] == [make_message(0).body]


# -- ASYNC_FLUSH --------------------------------------------------------------------------


def test_async_flush_acknowledges_before_fsync(tmp_path: pathlib.Path) -> None:
    with open_store(
        tmp_path / "store", flush_mode=FlushMode.ASYNC_FLUSH, flush_interval_ms=50
    ) as store:
        with HungDisk(store.commitlog) as disk:
            assert disk.entered.wait(5)  # the interval flush is stuck; nothing gets durable
            results = [store.put([make_message(i)]) for i in range(20)]
            assert {r.status for r in results} == {PutStatus.PUT_OK}
            assert store.commitlog.flushed_offset < end_of(results[-1])
            assert [m.body for m in read_queue(store, 0)] == [
                make_message(i).body for i in range(20)
            ]
        assert wait_until(lambda: store.commitlog.flushed_offset == store.commitlog.write_offset)


def test_async_flush_makes_writes_durable_within_a_few_intervals(tmp_path: pathlib.Path) -> None:
    with open_store(
        tmp_path / "store", flush_mode=FlushMode.ASYNC_FLUSH, flush_interval_ms=50
    ) as store:
        for round_ in range(3):
            results = [store.put([make_message(round_ * 50 + i)]) for i in range(50)]
            assert {r.status for r in results} == {PutStatus.PUT_OK}
            target = store.commitlog.write_offset
            assert wait_until(lambda: store.commitlog.flushed_offset >= target, timeout_s=2.0)  # noqa: B023
        assert store.commitlog.flushed_offset == store.commitlog.write_offset


# -- the asyncio appender ------------------------------------------------------------------


def test_async_appender_many_tasks_one_fsync_per_round(tmp_path: pathlib.Path) -> None:
    tasks, puts_each = 64, 20
    with open_store(tmp_path / "store") as store:

        async def scenario() -> tuple[list[list[Put]], PutResult, int, PutResult]:
            appender = AsyncAppender(store)
            appender.start()
            before = store.flusher.fsync_count

            async def producer(t: int) -> list[Put]:
                out = []
                for j in range(puts_each):
                    i = t * puts_each + j
                    result = await appender.put([make_message(i, queue_id=t % 4, size=200)])
                    out.append((i, result, store.commitlog.flushed_offset))
                return out

            producers = [producer(t) for t in range(tasks)]
            bad = appender.put([Message(TOPIC, 1, b"")])  # empty body, among the others
            *per_task, refused = await asyncio.gather(*producers, bad)
            fsyncs = store.flusher.fsync_count - before
            await appender.stop()
            after_stop = await appender.put([make_message(9999, queue_id=1)])
            return per_task, refused, fsyncs, after_stop  # type: ignore[return-value]

        per_task, refused, fsyncs, after_stop = asyncio.run(scenario())

    assert refused.status is PutStatus.MESSAGE_BODY_EMPTY
    assert len(per_task) == tasks
    expected: dict[int, dict[int, bytes]] = {q: {} for q in range(4)}
    for t, puts in enumerate(per_task):
        assert [r.status for _, r, _ in puts] == [PutStatus.PUT_OK] * puts_each
        assert all(durable >= end_of(r) for _, r, durable in puts)
        offsets = [r.appended[0].queue_offset for _, r, _ in puts]
        assert offsets == sorted(set(offsets))
        for i, r, _ in puts:
            expected[t % 4][r.appended[0].queue_offset] = make_message(i, size=200).body
    assert 0 < fsyncs < tasks * puts_each
    assert after_stop.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert after_stop.appended == []
    with open_store(tmp_path / "store") as store:
        for q in range(4):
            got = read_queue(store, q)
            assert [m.queue_offset for m in got] == list(range(tasks // 4 * puts_each))
            assert [m.body for m in got] == [expected[q][o] for o in sorted(expected[q])]


@pytest.mark.parametrize("hang", ["fsync-hangs", "flusher-lock-held"])
def test_async_appender_answers_flush_disk_timeout_without_blocking_the_loop(
    tmp_path: pathlib.Path, hang: str
) -> None:
    # 1 s, not less: the put after the hang needs an fsync within it, and CI's disk is busy
    with open_store(tmp_path / "store", flush_disk_timeout_ms=1_000) as store:

        async def scenario() -> tuple[PutResult, int, PutResult]:
            appender = AsyncAppender(store)
            appender.start()
            stuck = (
                HungDisk(store.commitlog)
                if hang == "fsync-hangs"
                else HeldFlusherLock(store.flusher)
            )
            ticks = 0

            async def heartbeat() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            beat = asyncio.create_task(heartbeat())
            with stuck:
                timed_out = await appender.put([make_message(1, queue_id=3)])
                ticks_while_stuck = ticks
            beat.cancel()
            end = timed_out.appended[-1].phys_offset + timed_out.appended[-1].size
            # the first record's own fsync, before the next put's
            assert await asyncio.to_thread(
                wait_until, lambda: store.commitlog.flushed_offset >= end
            )
            after = await appender.put([make_message(2, queue_id=3)])
            await appender.stop()
            return timed_out, ticks_while_stuck, after

        timed_out, ticks_while_stuck, after = asyncio.run(scenario())

        assert timed_out.status is PutStatus.FLUSH_DISK_TIMEOUT
        [appended] = timed_out.appended
        assert appended.queue_offset == 0
        assert ticks_while_stuck > 0  # the event loop kept running while the disk hung
        assert after.status is PutStatus.PUT_OK
        assert after.appended[0].queue_offset == 1
        assert [m.body for m in read_queue(store, 3)] == [
            make_message(1).body,
            make_message(2).body,
        ]


def test_async_appender_record_too_big_for_a_segment_fails_only_its_own_put(
    tmp_path: pathlib.Path,
) -> None:
    with open_store(tmp_path / "store") as store:

        async def scenario() -> list[PutResult]:
            appender = AsyncAppender(store)
            appender.start()
            too_big = Message(TOPIC, 0, b"x" * (SEGMENT_BYTES - 100))
            puts = [appender.put([too_big])]
            puts += [appender.put([make_message(i, queue_id=1)]) for i in range(5)]
            tasks = [asyncio.create_task(p) for p in puts]
            results = await asyncio.gather(*tasks)
            await appender.stop()
            return results

        big, *others = asyncio.run(scenario())

        assert big.status is PutStatus.MESSAGE_ILLEGAL
        assert [r.status for r in others] == [PutStatus.PUT_OK] * 5
        assert [m.body for m in read_queue(store, 1)] == [make_message(i).body for i in range(5)]


# -- closing ---------------------------------------------------------------------------------


def test_close_with_writes_in_flight_loses_nothing_acknowledged(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "store"
    writers = 8
    store = open_store(root)
    outcomes: list[list[tuple[int, PutResult]]] = [[] for _ in range(writers)]

    def writer(t: int) -> None:
        for j in range(100_000):
            i = t * 100_000 + j
            result = store.put([make_message(i, queue_id=t % 4, size=200)])
            outcomes[t].append((i, result))
            if not result.status.ok:
                return

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(writers)]
    for th in threads:
        th.start()
    try:
        assert wait_until(lambda: sum(len(o) for o in outcomes) >= 400)
    finally:
        store.close()
        for th in threads:
            th.join(10)

    acked: dict[int, dict[int, int]] = {q: {} for q in range(4)}
    for t, results in enumerate(outcomes):
        *oks, last = results
        assert {r.status for _, r in oks} <= {PutStatus.PUT_OK}
        assert last[1].status is PutStatus.SERVICE_NOT_AVAILABLE
        assert last[1].appended == []
        for i, r in oks:
            acked[t % 4][r.appended[0].queue_offset] = i
    with open_store(root) as store:
        assert not store.recovery.crashed
        for q in range(4):
            got = read_queue(store, q)
            # every acknowledged message is there, in queue order, and nothing else is
            assert [m.queue_offset for m in got] == sorted(acked[q]) == list(range(len(acked[q])))
            assert [m.body for m in got] == [
                make_message(acked[q][o], size=200).body for o in sorted(acked[q])
            ]


class _PauseLateWriter(threading.Condition):
    """The flusher's lock, made to stop one named thread just before it takes the lock: it
    widens the window between a writer's `flushed_offset` check and its registration."""

    writer_name = "late-writer"
    arrived: threading.Event
    go_on: threading.Event

    def __enter__(self) -> bool:
        if threading.current_thread().name == self.writer_name and not self.go_on.is_set():
            self.arrived.set()
            self.go_on.wait(10)
        return super().__enter__()


def test_a_writer_registering_for_fsync_while_close_runs_is_still_answered(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "store"
    store = open_store(root, flush_disk_timeout_ms=1_000)
    assert store.put([make_message(0)]).status is PutStatus.PUT_OK
    cond = store.flusher._cond
    cond.arrived, cond.go_on = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    cond.__class__ = _PauseLateWriter
    answer: list[PutResult] = []
    late = threading.Thread(
        target=lambda: answer.append(store.put([make_message(1)])), name="late-writer"
    )
    try:
        late.start()
        # appended, found the message not yet durable, about to register with the flusher
        assert cond.arrived.wait(5)  # type: ignore[attr-defined]
        store.close()
    finally:
        cond.go_on.set()  # type: ignore[attr-defined]
        late.join(10)
        cond.__class__ = threading.Condition
        store.close()

    with open_store(root) as reopened:
        assert [m.body for m in read_queue(reopened, 0)] == [
            make_message(0).body,
            make_message(1).body,
        ]
    assert answer[0].status is PutStatus.PUT_OK
