"""The largest gRPC message Capstan's servers and channels send or receive: a batch of
large bodies, a pull of many, or a replication chunk. One limit for brokers, clients and
replicas, so none refuses what another sends."""

from __future__ import annotations

MAX_MESSAGE_BYTES = 128 * 1024 * 1024
"""In bytes; the official clients allow any size."""

MESSAGE_SIZE_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
]
"""gRPC server and channel options that apply the limit."""
