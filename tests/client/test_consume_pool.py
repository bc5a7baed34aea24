"""The consume services' thread pool: parallel, survives a failing task, drops the queue on
shutdown and lets running tasks finish."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from capstan.client.consumer.consume_pool import ConsumePool


def test_tasks_run_in_parallel_up_to_the_thread_count() -> None:
    pool = ConsumePool(4, "t")
    barrier = threading.Barrier(4, timeout=5)
    names: set[str] = set()
    lock = threading.Lock()
    passed = threading.Semaphore(0)

    def task() -> None:
        with lock:
            names.add(threading.current_thread().name)
        barrier.wait()  # only passes if four tasks run at once
        passed.release()

    for _ in range(4):
        pool.submit(task)
    for _ in range(4):
        assert passed.acquire(timeout=5)
    pool.shutdown()
    assert names == {f"t_{n}" for n in range(4)}


def test_a_raising_task_is_logged_and_the_thread_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    pool = ConsumePool(1, "t")
    done = threading.Event()

    def fail() -> None:
        raise ValueError("listener bug")

    with caplog.at_level(logging.ERROR):
        pool.submit(fail)
        pool.submit(done.set)
        assert done.wait(5)
    pool.shutdown()
    assert any("consume task failed" in r.message for r in caplog.records)


def test_shutdown_waits_for_running_tasks_and_drops_queued_ones() -> None:
    pool = ConsumePool(1, "t")
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def slow() -> None:
        started.set()
        release.wait(5)
        ran.append("slow")

    pool.submit(slow)
    assert started.wait(5)
    for _ in range(10):
        pool.submit(ran.append, "queued")
    threading.Timer(0.2, release.set).start()
    pool.shutdown(wait=True)
    assert ran == ["slow"]
    pool.submit(ran.append, "after")  # ignored, not raised
    time.sleep(0.05)
    assert ran == ["slow"]


def test_zero_threads_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        ConsumePool(0, "t")
