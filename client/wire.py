"""Converting between the SDK's types and the `apache.rocketmq.v2` messages on the wire."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
import zlib
from collections.abc import Iterable

from google.protobuf.duration_pb2 import Duration
from rocketmq.grpc_protocol import definition_pb2 as pb

from capstan.client.message import Message, MessageType, MessageView

V2_MESSAGE_TYPES: dict[MessageType, int] = {
    MessageType.NORMAL: pb.NORMAL,
    MessageType.FIFO: pb.FIFO,
    MessageType.DELAY: pb.DELAY,
    MessageType.TRANSACTION: pb.TRANSACTION,
}
_SDK_MESSAGE_TYPES = {v: k for k, v in V2_MESSAGE_TYPES.items()}

_BORN_HOST = socket.gethostname() or "localhost"


def message_types(v2_types: Iterable[int]) -> frozenset[MessageType]:
    """The SDK's view of a queue's `accept_message_types` (unknown values are dropped)."""
    return frozenset(_SDK_MESSAGE_TYPES[t] for t in v2_types if t in _SDK_MESSAGE_TYPES)


def split_address(address: str) -> tuple[str, int]:
    """("host", port) of "host:port" or "[v6]:port"; ValueError if it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or any(c in host for c in ";, \t"):
        raise ValueError(f"endpoint {address!r} is not host:port")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def endpoints(address: str) -> pb.Endpoints:
    """The v2 Endpoints naming one "host:port"."""
    host, port = split_address(address)
    try:
        scheme = pb.IPv6 if ipaddress.ip_address(host).version == 6 else pb.IPv4
    except ValueError:
        scheme = pb.DOMAIN_NAME
    return pb.Endpoints(scheme=scheme, addresses=[pb.Address(host=host, port=port)])


def addresses(eps: pb.Endpoints) -> tuple[str, ...]:
    """Every "host:port" of an Endpoints, in its order (a broker group's replicas)."""
    return tuple(join_address(str(a.host), int(a.port)) for a in eps.addresses)


def duration(seconds: float) -> Duration:
    d = Duration()
    d.FromMilliseconds(round(seconds * 1000))
    return d


def to_v2(message: Message, message_id: str, message_type: MessageType) -> pb.Message:
    """The wire form of a message to send."""
    sp = pb.SystemProperties(
        message_id=message_id,
        message_type=V2_MESSAGE_TYPES[message_type],
        body_encoding=pb.IDENTITY,
        born_host=_BORN_HOST,
    )
    sp.born_timestamp.FromMilliseconds(time.time_ns() // 1_000_000)
    if message.tag is not None:
        sp.tag = message.tag
    if message.keys:
        sp.keys.extend(message.keys)
    if message.message_group is not None:
        sp.message_group = message.message_group
    if message.delivery_timestamp_ms is not None:
        sp.delivery_timestamp.FromMilliseconds(message.delivery_timestamp_ms)
    return pb.Message(
        topic=pb.Resource(name=message.topic),
        user_properties=message.properties,
        system_properties=sp,
        body=bytes(message.body),
    )


def _ms(ts: object) -> int:
    return int(ts.ToMilliseconds())  # type: ignore[attr-defined]


def _inflated(body: bytes) -> bytes:
    """A body its producer sent gzip-compressed, as it was before."""
    return zlib.decompress(body, 32 + zlib.MAX_WBITS)


def to_view(m: pb.Message) -> MessageView:
    """A message the broker sent us, as the SDK shows it."""
    sp = m.system_properties
    has = sp.HasField
    return MessageView(
        message_id=str(sp.message_id),
        topic=str(m.topic.name),
        body=_inflated(m.body) if sp.body_encoding == pb.GZIP else bytes(m.body),
        tag=str(sp.tag) if has("tag") else None,
        keys=tuple(str(k) for k in sp.keys),
        properties={str(k): str(v) for k, v in m.user_properties.items()},
        message_group=str(sp.message_group) if has("message_group") else None,
        delivery_timestamp_ms=_ms(sp.delivery_timestamp) if has("delivery_timestamp") else None,
        born_timestamp_ms=_ms(sp.born_timestamp) if has("born_timestamp") else 0,
        born_host=str(sp.born_host),
    )


def user_agent() -> pb.UA:
    return pb.UA(language=pb.PYTHON, version="capstan", platform=os.uname().sysname)
