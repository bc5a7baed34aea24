"""The operator's shared clients: a client replaced (the group's master moved) is not
closed under the handlers still awaiting a call on it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from capstan.client.errors import ClientError
from capstan.operator import operator_context
from capstan.operator.manifests.cluster import ClusterFacts
from capstan.operator.metrics import OperatorMetrics
from capstan.operator.operator_context import OperatorContext
from capstan.v1 import admin_pb2 as apb


def test_a_replaced_admin_lets_the_calls_running_on_it_end_on_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call in flight on the old client ends with its own error (here its deadline, 1.5 s),
    not cancelled: a cancelled Kopf timer would stop for good. The old client is closed
    RETIRE_AFTER_S later."""
    monkeypatch.setattr(operator_context, "RETIRE_AFTER_S", 3.0)
    silent = socket.socket()  # accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    monkeypatch.setattr(operator_context.names, "BROKER_GRPC_PORT", port)
    monkeypatch.setattr(operator_context.names, "pod_host", lambda *_: "127.0.0.1")

    async def scenario() -> BaseException | None:
        ctx = OperatorContext(None, ClusterFacts(30, True, True), OperatorMetrics())  # type: ignore[arg-type]
        first = await ctx.admin("ns", "g")
        request = apb.DescribeBrokerRequest()
        call = asyncio.ensure_future(first._admin.call("DescribeBroker", request, timeout_s=1.5))
        await asyncio.sleep(0.3)
        monkeypatch.setattr(operator_context.names, "headless_service", lambda _g: "moved")
        second = await ctx.admin("ns", "g", "g-1")  # the master moved: a new client
        assert second is not first
        try:
            await call
        except (ClientError, asyncio.CancelledError) as exc:
            return exc
        finally:
            await ctx.close()
        return None

    try:
        ended = asyncio.run(scenario())
    finally:
        silent.close()
    assert isinstance(ended, ClientError), ended
