"""How a retrying background routine reports failures: a full disk once per episode and
without a traceback, anything else with its traceback every time."""

from __future__ import annotations

import errno
import logging

import pytest

from capstan.common.disk_full import RoutineFailures

log = logging.getLogger("tests.routine")


def full() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_is_said_once_until_the_routine_succeeds_again(
    caplog: pytest.LogCaptureFixture,
):
    failures = RoutineFailures(log, "transaction checks")
    with caplog.at_level(logging.INFO, logger="tests.routine"):
        for _ in range(50):
            failures.failed(full())
        failures.succeeded()
        failures.succeeded()
        failures.failed(full())
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "transaction checks cannot write: the disk is full (No space left on device); "
        "retrying until space is freed",
        "transaction checks write again: space was freed",
        "transaction checks cannot write: the disk is full (No space left on device); "
        "retrying until space is freed",
    ]
    assert not any(r.exc_info for r in caplog.records)


def test_any_other_failure_keeps_its_traceback(caplog: pytest.LogCaptureFixture):
    failures = RoutineFailures(log, "timer deliveries")
    with caplog.at_level(logging.INFO, logger="tests.routine"):
        failures.failed(ValueError("a bug"))
        failures.failed(OSError(errno.EIO, "Input/output error"))
    assert [r.getMessage() for r in caplog.records] == ["timer deliveries failed; retrying"] * 2
    assert all(r.exc_info for r in caplog.records)
