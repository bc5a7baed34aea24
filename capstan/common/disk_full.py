"""A full disk, told apart from other write failures and said in words.

A write that fails for want of space (ENOSPC, a quota, a file-size limit) changes nothing
lasting and succeeds again once space is freed, so callers answer it with a status that
says so (the store's DISK_FULL, RocketMQ's answer to a full store, gRPC's
RESOURCE_EXHAUSTED) rather than an error with an errno in it.
"""

from __future__ import annotations

import errno
import logging

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def disk_full_detail(what: str, exc: OSError) -> str:
    """What a client is told: `what` could not be written (say "the message")."""
    return (
        f"the server's disk is full: {what} was not written; writes resume once space is "
        f"freed ({exc.strerror})"
    )


class RoutineFailures:
    """How a background routine that retries reports its failures: a full disk once when
    it fills (no traceback, it is no bug) and once when the routine succeeds again; any
    other failure with its traceback, each time. Use from one thread."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        """`what` names the routine in its lines ("transaction checks")."""
        self._logger = logger
        self._what = what
        self._disk_full = False

    def failed(self, exc: BaseException) -> None:
        if not is_disk_full(exc):
            self._logger.error("%s failed; retrying", self._what, exc_info=exc)
            return
        if not self._disk_full:
            self._disk_full = True
            strerror = exc.strerror if isinstance(exc, OSError) else str(exc)
            self._logger.error(
                "%s cannot write: the disk is full (%s); retrying until space is freed",
                self._what,
                strerror,
            )

    def succeeded(self) -> None:
        if self._disk_full:
            self._disk_full = False
            self._logger.warning("%s write again: space was freed", self._what)
