"""Ending a capstan.v1 call with a gRPC status code and a message saying what was wrong."""

from __future__ import annotations

from typing import NoReturn

import grpc


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, detail: str) -> NoReturn:
    await context.abort(code, detail)
    raise AssertionError("abort returned")  # pragma: no cover


async def require(context: grpc.aio.ServicerContext, **fields: str) -> None:
    """INVALID_ARGUMENT naming the first of `fields` (name=value) left empty: a call without
    a name it needs is malformed, not a lookup of nothing (NOT_FOUND)."""
    for name, value in fields.items():
        if not value:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{name} is required")
