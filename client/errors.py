"""What can go wrong in the SDK, and whether trying again can help.

Every failure the SDK raises is a `ClientError`. Its class says whether a retry may
succeed (`retriable`, as aiokafka's errors do): the broker could not be reached or was
temporarily unable to answer (retriable), or it refused the request as it stands (not
retriable: the same request would be refused again). `code` names the cause: the
`apache.rocketmq.v2` Code the broker answered (``"TOPIC_NOT_FOUND"``), or the gRPC status
of a call that never got an answer (``"UNAVAILABLE"``).
"""

from __future__ import annotations

from typing import ClassVar

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

# Broker answers that say "not now" rather than "not this": overload, a timeout while
# storing or replicating, an internal failure.
_RETRIABLE_V2_CODES = frozenset(
    {
        pb.TOO_MANY_REQUESTS,
        pb.REQUEST_TIMEOUT,
        pb.INTERNAL_ERROR,
        pb.INTERNAL_SERVER_ERROR,
        pb.PROXY_TIMEOUT,
        pb.MASTER_PERSISTENCE_TIMEOUT,
        pb.SLAVE_PERSISTENCE_TIMEOUT,
        pb.HA_NOT_AVAILABLE,
    }
)

# gRPC statuses of a call that did not reach the broker or got no answer in time.
_TRANSPORT_STATUSES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class ClientError(Exception):
    """A request failed. `retriable` says whether the same request may succeed later;
    `attempts` is how many times the SDK tried before giving up."""

    retriable: ClassVar[bool] = False

    def __init__(
        self, message: str, code: str = "", *, attempts: int = 1, detail: str = ""
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.attempts = attempts
        # The server's own words (or the status's name), without what the call was doing.
        self.detail = detail or message

    def __str__(self) -> str:
        tried = f" (after {self.attempts} attempts)" if self.attempts > 1 else ""
        return f"{self.code}: {self.message}{tried}" if self.code else self.message + tried


class TransportError(ClientError):
    """The broker could not be reached, or did not answer within the deadline."""

    retriable = True


class BrokerBusy(ClientError):
    """The broker answered but could not do it now: overloaded, a storage or replication
    timeout, an internal error. The message may or may not have been stored."""

    retriable = True


class RequestRefused(ClientError):
    """The broker refused the request as it stands (bad request, illegal tag or key, body
    too large, message type the topic does not accept, forbidden, …)."""


class TopicNotFound(RequestRefused):
    """No configured endpoint knows the topic."""


class TransactionError(RequestRefused):
    """The broker does not know the transaction (unknown or malformed transaction id)."""


class NotFound(RequestRefused):
    """An admin call named a topic, group, message or broker group that does not exist."""


class AlreadyExists(RequestRefused):
    """An admin call would create what is already there."""


class AccessRefused(RequestRefused):
    """The call's signature was refused (v2 UNAUTHORIZED, v1 UNAUTHENTICATED: missing,
    unknown, wrong or expired keys) or its user may not do it (v2 FORBIDDEN, v1
    PERMISSION_DENIED); the detail names the action and the resource."""


class NotReady(ClientError):
    """The server cannot do it in its present state, which may pass: a controller that is
    not the leader, a broker that is not the master, broker groups that differ after a
    change made on some of them."""

    retriable = True


def code_name(code: int) -> str:
    """The v2 Code's name, or the number when this client's stubs do not know it."""
    try:
        return str(pb.Code.Name(code))
    except ValueError:
        return str(code)


def from_status(status: pb.Status, context: str = "") -> ClientError:
    """The error a non-OK v2 `Status` stands for."""
    code = int(status.code)
    name = code_name(code)
    text = status.message or name
    message = f"{context}: {text}" if context else text
    if code == pb.TOPIC_NOT_FOUND:
        return TopicNotFound(message, name, detail=text)
    if code == pb.INVALID_TRANSACTION_ID:
        return TransactionError(message, name, detail=text)
    if code in (pb.UNAUTHORIZED, pb.FORBIDDEN):
        return AccessRefused(message, name, detail=text)
    if code in _RETRIABLE_V2_CODES:
        return BrokerBusy(message, name, detail=text)
    return RequestRefused(message, name, detail=text)


def from_rpc_error(error: grpc.RpcError, context: str = "") -> ClientError:
    """The error a failed gRPC call stands for (the broker answered no v2 status)."""
    status = error.code() if isinstance(error, grpc.Call) else None
    name = status.name if status is not None else "UNKNOWN"
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    message = f"{context}: {details or name}" if context else details or name
    if status in _TRANSPORT_STATUSES:
        return TransportError(message, name, detail=details or name)
    return ClientError(message, name, detail=details or name)


# capstan.v1 answers, by gRPC status (those not named are refusals).
_ADMIN_ERRORS: dict[grpc.StatusCode, type[ClientError]] = {
    grpc.StatusCode.UNAVAILABLE: TransportError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TransportError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: BrokerBusy,
    grpc.StatusCode.INTERNAL: BrokerBusy,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: NotReady,
    grpc.StatusCode.CANCELLED: TransportError,
    grpc.StatusCode.UNAUTHENTICATED: AccessRefused,
    grpc.StatusCode.PERMISSION_DENIED: AccessRefused,
}


def from_admin_rpc_error(error: grpc.RpcError, context: str = "") -> ClientError:
    """The error a failed capstan.v1 call (Admin, Controller) stands for: its gRPC status
    is the answer, as those services give no v2 status."""
    answered = isinstance(error, (grpc.Call, grpc.aio.AioRpcError))
    status = error.code() if answered else None
    name = status.name if status is not None else "UNKNOWN"
    details = error.details() if answered else str(error)
    message = f"{context}: {details or name}" if context else details or name
    kind = _ADMIN_ERRORS.get(status, RequestRefused) if status is not None else ClientError
    return kind(message, name, detail=details or name)


def from_exception(error: BaseException, context: str = "") -> ClientError:
    """Any failure of a call as a ClientError; connection errors are transport errors."""
    if isinstance(error, ClientError):
        return error
    if isinstance(error, grpc.RpcError):
        return from_rpc_error(error, context)
    if isinstance(error, OSError):
        return TransportError(f"{context}: {error}" if context else str(error), "UNAVAILABLE")
    return ClientError(f"{context}: {error!r}" if context else repr(error), type(error).__name__)
