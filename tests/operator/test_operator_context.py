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


def test_reconciles_of_one_object_take_turns_and_others_run_alongside() -> None:
    """A Topic's create handler and its timer overlap in Kopf: they must not both act."""
    ctx = OperatorContext(None, ClusterFacts(30, True, True), OperatorMetrics())  # type: ignore[arg-type]
    spans: list[tuple[str, float, float]] = []

    def topic(name: str) -> dict[str, object]:
        return {"metadata": {"namespace": "ns", "name": name}}

    async def reconcile(label: str, name: str) -> None:
        async with ctx.one_at_a_time("Topic", topic(name)):
            began = asyncio.get_running_loop().time()
            await asyncio.sleep(0.2)
            spans.append((label, began, asyncio.get_running_loop().time()))

    async def scenario() -> None:
        await asyncio.gather(
            reconcile("create", "prices"), reconcile("timer", "prices"), reconcile("other", "x")
        )

    asyncio.run(scenario())
    by = {label: (began, ended) for label, began, ended in spans}
    first, second = sorted([by["create"], by["timer"]])
    assert second[0] >= first[1]  # the second waited for the first to end
    assert by["other"][0] < first[1]  # another object did not wait
    assert not ctx._reconciling  # nothing kept once no one reconciles
