"""grpc's traceback for a client gone as its call ended becomes one DEBUG line; the rest of
grpc's log is untouched."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest
from grpc._cython import cygrpc

from capstan.common.grpc_server_log import GRPC_LOGGER, quiet_client_gone

METHOD = "/apache.rocketmq.v2.MessagingService/Telemetry"


@pytest.fixture
def grpc_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    logger = logging.getLogger(GRPC_LOGGER)
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    level, filters = logger.level, list(logger.filters)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    quiet_client_gone()
    quiet_client_gone()  # twice, as two servers in one process would
    try:
        yield logger, out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.filters[:] = filters


def _log_raised(logger: logging.Logger, error: Exception) -> None:
    """As grpc's server logs what a servicer's call ended with."""
    try:
        raise error
    except Exception as e:
        logger.exception("Unexpected [%s] raised by servicer method [%s]", type(e).__name__, METHOD)


def test_a_status_the_gone_client_could_not_get_leaves_no_traceback(grpc_log):
    logger, out = grpc_log
    _log_raised(logger, cygrpc.ExecuteBatchError('Failed "execute_batch": (op,)'))
    assert out.getvalue() == ""
    logger.setLevel(logging.DEBUG)
    _log_raised(logger, cygrpc.ExecuteBatchError('Failed "execute_batch": (op,)'))
    assert out.getvalue() == (
        f"DEBUG {GRPC_LOGGER}: a client left before the status of its call {METHOD} could be sent\n"
    )
    assert len(logger.filters) == 1


def test_any_other_error_of_grpc_keeps_its_traceback(grpc_log):
    logger, out = grpc_log
    _log_raised(logger, ValueError("a servicer's own failure"))
    logger.error("a line without an exception")
    said = out.getvalue()
    assert said.startswith(f"ERROR {GRPC_LOGGER}: Unexpected [ValueError] raised by servicer")
    assert "Traceback (most recent call last)" in said
    assert "ValueError: a servicer's own failure" in said
    assert said.endswith("ERROR grpc._cython.cygrpc: a line without an exception\n")
