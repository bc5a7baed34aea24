"""Ending a capstan.v1 call with a gRPC status code and a message saying what was wrong."""

from __future__ import annotations

from typing import NoReturn

import grpc


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, detail: str) -> NoReturn:
    await context.abort(code, detail)
    raise AssertionError("abort returned")  # pragma: no cover
