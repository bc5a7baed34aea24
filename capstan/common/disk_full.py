"""A full disk, told apart from other write failures and said in words.

A write that fails for want of space (ENOSPC, a quota, a file-size limit) changes nothing
lasting and succeeds again once space is freed, so callers answer it with a status that
says so (the store's DISK_FULL, RocketMQ's answer to a full store, gRPC's
RESOURCE_EXHAUSTED) rather than an error with an errno in it.
"""

from __future__ import annotations

import errno

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def disk_full_detail(what: str, exc: OSError) -> str:
    """What a client is told: `what` could not be written (say "the message")."""
    return (
        f"the server's disk is full: {what} was not written; writes resume once space is "
        f"freed ({exc.strerror})"
    )
