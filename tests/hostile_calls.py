"""Hostile calls to every method a Capstan server serves, for the fuzz tests of the broker
and the controller.

The methods come from the server itself, through gRPC reflection: its services'
descriptors name every method, whether it streams, and its request type. Each method gets
payloads of three kinds, from a seeded generator: random bytes, a well-formed request cut
short at a random byte, and one payload over the server's receive limit. The payloads go out
as raw bytes (no serializer), so what the server receives is exactly what was generated.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.descriptor_pool import DescriptorPool
from google.protobuf.message import DecodeError, Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

REFUSED_MALFORMED = grpc.StatusCode.INVALID_ARGUMENT
REFUSED_OVERSIZED = grpc.StatusCode.RESOURCE_EXHAUSTED
ANSWERS_OF_A_FAULT = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
"""A server that answers one of these to a hostile call failed inside its handler."""
REFUSED_BEFORE_READING = {
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.UNIMPLEMENTED,
}
"""What a request-streaming method may answer before it reads a message (a standalone
broker's Replicate, the controller's Telemetry)."""


@dataclass(frozen=True)
class Method:
    path: str
    """/package.Service/Method"""
    request: Descriptor
    client_streaming: bool
    server_streaming: bool

    def parses(self, payload: bytes) -> bool:
        message = message_factory.GetMessageClass(self.request)()
        try:
            message.ParseFromString(payload)
        except DecodeError:
            return False
        return True


@dataclass(frozen=True)
class Payload:
    kind: str
    """"empty", "random", "truncated" or "oversized"."""
    data: bytes


def served_methods(address: str) -> list[Method]:
    """Every method of every service `address` lists through reflection."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        pool = DescriptorPool(database)
        names = sorted(database.get_services())
        return [_method(m) for name in names for m in pool.FindServiceByName(name).methods]


def one_per_service(methods: list[Method]) -> dict[str, Method]:
    """The first method of each service that takes a single request (every one of the
    services served has one), by service name."""
    chosen: dict[str, Method] = {}
    for m in methods:
        if not m.client_streaming:
            chosen.setdefault(m.path.split("/")[1], m)
    return chosen


def _method(m: MethodDescriptor) -> Method:
    return Method(
        f"/{m.containing_service.full_name}/{m.name}",
        m.input_type,
        m.client_streaming,
        m.server_streaming,
    )


def payloads(method: Method, rng: random.Random, each: int) -> Iterator[Payload]:
    """An empty request (every field missing), `each` random and `each` truncated
    payloads for `method`."""
    yield Payload("empty", b"")
    for _ in range(each):
        yield Payload("random", rng.randbytes(rng.randint(1, 200)))
    whole = well_formed(method.request, rng).SerializeToString()
    for _ in range(each):
        yield Payload("truncated", whole[: rng.randint(1, max(1, len(whole) - 1))])


def oversized(limit_bytes: int) -> Payload:
    """A payload one byte over a receive limit: a field-1 bytes value of that length."""
    return Payload("oversized", b"\x0a" + _varint(limit_bytes) + bytes(limit_bytes))


def well_formed(descriptor: Descriptor, rng: random.Random, depth: int = 0) -> Message:
    """A request of type `descriptor` with every field set to a plausible value."""
    message = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        oneof = field.containing_oneof
        if oneof is not None and field.index != oneof.fields[0].index:
            continue  # one member of each oneof
        if field.message_type is not None:
            if depth < 4 and not field.message_type.GetOptions().map_entry:
                target = getattr(message, field.name)
                child = well_formed(field.message_type, rng, depth + 1)
                if field.is_repeated:
                    target.add().CopyFrom(child)
                else:
                    target.CopyFrom(child)
            continue
        value = _scalar(field, rng)
        if field.is_repeated:
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    return message


def _scalar(field: FieldDescriptor, rng: random.Random) -> object:
    if field.type == FieldDescriptor.TYPE_STRING:
        return "fuzz-" + str(rng.randint(0, 999))
    if field.type == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(8)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return True
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return 1.5
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number
    return rng.randint(1, 1000)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def wrong_answer(method: Method, payload: Payload, code: grpc.StatusCode) -> str:
    """Why `code` is the wrong answer to `payload`, or "" when it is a right one."""
    if not method.parses(payload.data):
        expected = {REFUSED_MALFORMED}
        if method.client_streaming:
            expected |= REFUSED_BEFORE_READING
    else:  # any answer but a fault; only a stream may rightly wait (a watch, a long poll)
        expected = {c for c in grpc.StatusCode if c not in ANSWERS_OF_A_FAULT}
        if not method.server_streaming:
            expected.discard(grpc.StatusCode.DEADLINE_EXCEEDED)
    if code in expected:
        return ""
    return f"{method.path} answered {code.name} to {payload.kind} {payload.data[:40]!r}"


def call(
    channel: grpc.Channel, method: Method, payload: bytes, timeout_s: float
) -> grpc.StatusCode:
    """Send `payload` as the request (the one message of a request stream) and return the
    code the call ends with; a response stream counts as OK once it yields an answer."""
    if method.client_streaming and method.server_streaming:
        stream = channel.stream_stream(method.path)(iter([payload]), timeout=timeout_s)
        return _first_answer(stream)
    if method.client_streaming:
        invoke = channel.stream_unary(method.path)
        return _unary_code(lambda: invoke(iter([payload]), timeout=timeout_s))
    if method.server_streaming:
        return _first_answer(channel.unary_stream(method.path)(payload, timeout=timeout_s))
    invoke_unary = channel.unary_unary(method.path)
    return _unary_code(lambda: invoke_unary(payload, timeout=timeout_s))


def _unary_code(invoke: object) -> grpc.StatusCode:
    try:
        invoke()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _first_answer(stream: grpc.Call) -> grpc.StatusCode:
    try:
        next(iter(stream))  # type: ignore[call-overload]
    except StopIteration:
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    stream.cancel()
    return grpc.StatusCode.OK
