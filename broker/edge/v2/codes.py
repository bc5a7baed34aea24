"""v2 status codes: building `Status` values and mapping store outcomes onto them."""

from __future__ import annotations

from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.broker.store.status import PutResult, PutStatus

Code = pb.Code


class RequestError(Exception):
    """A request the broker refuses; carries the v2 code the client gets."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> pb.Status:
        return pb.Status(code=self.code, message=self.message)


def ok(message: str = "OK") -> pb.Status:
    return pb.Status(code=pb.OK, message=message)


def status(code: int, message: str) -> pb.Status:
    return pb.Status(code=code, message=message)


_PUT_CODES: dict[PutStatus, int] = {
    PutStatus.PUT_OK: pb.OK,
    PutStatus.FLUSH_DISK_TIMEOUT: pb.MASTER_PERSISTENCE_TIMEOUT,
    PutStatus.MESSAGE_ILLEGAL: pb.BAD_REQUEST,
    PutStatus.MESSAGE_BODY_EMPTY: pb.MESSAGE_BODY_EMPTY,
    PutStatus.MESSAGE_BODY_TOO_LARGE: pb.MESSAGE_BODY_TOO_LARGE,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: pb.MESSAGE_PROPERTIES_TOO_LARGE,
    PutStatus.TOPIC_NOT_EXIST: pb.TOPIC_NOT_FOUND,
    PutStatus.QUEUE_NOT_EXIST: pb.BAD_REQUEST,
    PutStatus.NOT_WRITEABLE: pb.FORBIDDEN,
    # RocketMQ's broker answers a full store SERVICE_NOT_AVAILABLE, which its proxy has no
    # v2 code for and passes on as INTERNAL_SERVER_ERROR; the detail says it in words.
    PutStatus.DISK_FULL: pb.INTERNAL_SERVER_ERROR,
    PutStatus.IO_ERROR: pb.INTERNAL_SERVER_ERROR,
    PutStatus.SERVICE_NOT_AVAILABLE: pb.INTERNAL_SERVER_ERROR,
    PutStatus.FLUSH_SLAVE_TIMEOUT: pb.SLAVE_PERSISTENCE_TIMEOUT,
    PutStatus.IN_SYNC_REPLICAS_NOT_ENOUGH: pb.HA_NOT_AVAILABLE,
    PutStatus.NOT_MASTER: pb.HA_NOT_AVAILABLE,
}


def put_code(put: PutStatus) -> int:
    return _PUT_CODES.get(put, pb.INTERNAL_SERVER_ERROR)


def put_status(result: PutResult) -> pb.Status:
    """The v2 status of a store write: OK, or the refusal's code and detail."""
    if result.status.ok:
        return ok()
    return status(put_code(result.status), result.detail or result.status.name)


def combined(codes: list[int]) -> int:
    """One code for a batch: the shared code, or MULTIPLE_RESULTS when they differ."""
    if not codes:
        return pb.OK
    first = codes[0]
    return first if all(c == first for c in codes) else pb.MULTIPLE_RESULTS
