"""Signing every call of a client: the RocketMQ 5 signature, made afresh per call (its time
must be within the broker's clock skew), added to the call's metadata by a channel
interceptor, so every stub on a signed channel signs without knowing it."""

from __future__ import annotations

from typing import Any

import grpc

from capstan.security.signature import Credentials, signed_metadata


class SigningInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[misc]
):
    def __init__(self, credentials: Credentials) -> None:
        self._credentials = credentials

    def _signed(self, details: Any) -> Any:
        metadata = [*(details.metadata or ()), *signed_metadata(self._credentials)]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._signed(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._signed(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._signed(details), requests)


def signed_channel(channel: grpc.Channel, credentials: Credentials | None) -> grpc.Channel:
    """`channel`, signing each call with `credentials` (as it is, without them)."""
    if credentials is None:
        return channel
    return grpc.intercept_channel(channel, SigningInterceptor(credentials))
