"""RequestGuard on an in-process grpc.aio server: a handler's unexpected exception answers
INTERNAL with one traceback in the log for its first, and NotImplementedError answers
UNIMPLEMENTED without a line."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from capstan.common.grpc_guard import RequestGuard


def _handlers() -> grpc.GenericRpcHandler:
    async def broken(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise ValueError(f"no sense in {request!r}")

    async def absent(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise NotImplementedError("Method not implemented!")

    return grpc.method_handlers_generic_handler(
        "test.Guarded",
        {
            "Broken": grpc.unary_unary_rpc_method_handler(broken),
            "Absent": grpc.unary_unary_rpc_method_handler(absent),
        },
    )


def test_failures_answer_internal_with_one_traceback(caplog: pytest.LogCaptureFixture) -> None:
    codes = asyncio.run(_call_each())
    assert set(codes) == {
        (grpc.StatusCode.INTERNAL, "test.Guarded/Broken failed: ValueError: no sense in b'x'"),
        (grpc.StatusCode.UNIMPLEMENTED, "test.Guarded/Absent is not served by the test server"),
    }
    ours = [r for r in caplog.records if r.name == "capstan.common.grpc_guard"]
    assert [(r.getMessage(), r.exc_info is not None) for r in ours] == [
        ("test.Guarded/Broken failed: ValueError: no sense in b'x'", True)
    ]
    assert not [r for r in caplog.records if r.name.startswith("grpc")]


async def _call_each() -> list[tuple[grpc.StatusCode, str]]:
    """50 calls of a handler that fails, 5 of one that is not implemented."""
    server = grpc.aio.server(interceptors=[RequestGuard("the test server")])
    server.add_generic_rpc_handlers([_handlers()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            codes = []
            for method in ["Broken"] * 50 + ["Absent"] * 5:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await channel.unary_unary(f"/test.Guarded/{method}")(b"x", timeout=5)
                codes.append((refused.value.code(), refused.value.details()))
    finally:
        await server.stop(None)
    return codes
