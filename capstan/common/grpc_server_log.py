"""gRPC's own log, kept to what an operator can act on.

When a client goes away just as its call ends (a stream cancelled while the server's
status for it is on its way, a flood of calls from a client that does not wait for the
answers), grpc's asyncio server may fail to send that status before it has noticed the
client is gone. It then logs an ERROR with a traceback out of its Cython internals
("Unexpected [ExecuteBatchError] raised by servicer method [...]"), although the call had
been served and there is nobody left to tell. `quiet_client_gone` turns that record into
one DEBUG line naming the method; every other record of grpc's passes unchanged.
"""

from __future__ import annotations

import logging

GRPC_LOGGER = "grpc._cython.cygrpc"
CLIENT_GONE = "ExecuteBatchError"
"""The name of grpc's exception for a batch of call operations the core refused."""


class ClientGoneFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None or type(error).__name__ != CLIENT_GONE:
            return True
        said = record.getMessage()
        method = said.rsplit("[", 1)[-1].rstrip("]") if "[" in said else ""
        record.msg = "a client left before the status of its call %s could be sent"
        record.args = (method or "(unknown method)",)
        record.exc_info = None
        record.exc_text = None
        record.levelno = logging.DEBUG
        record.levelname = logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_FILTER = ClientGoneFilter()


def quiet_client_gone() -> None:
    """Install the filter on grpc's server logger (once per process; repeating is a no-op)."""
    logger = logging.getLogger(GRPC_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
