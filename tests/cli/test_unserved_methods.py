"""A call to a method a server does not serve is answered UNIMPLEMENTED, naming the method
and who serves it, and leaves no traceback in the server's log (the generated base classes
raise NotImplementedError, which grpc logs with one)."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from rocketmq.grpc_protocol import service_pb2 as svc

from tests.broker.v2_requests import stub, v2_message


def test_the_controller_answers_unimplemented_for_a_broker_call_without_a_traceback(controller):
    messaging = stub(controller.address)
    with pytest.raises(grpc.RpcError) as sent:
        messaging.SendMessage(svc.SendMessageRequest(messages=[v2_message("T")]), timeout=5)
    assert sent.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert sent.value.details().startswith(
        "apache.rocketmq.v2.MessagingService/SendMessage is not served by the Capstan "
        "controller; call it on a broker"
    )
    with pytest.raises(grpc.RpcError) as telemetry:
        list(messaging.Telemetry(iter([svc.TelemetryCommand()]), timeout=5))
    assert telemetry.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert "MessagingService/Telemetry is not served" in telemetry.value.details()
    assert_no_traceback(controller.log)


def test_a_broker_answers_unimplemented_for_what_it_does_not_serve(broker):
    with pytest.raises(grpc.RpcError) as refused:
        stub(broker.address).SyncLiteSubscription(svc.SyncLiteSubscriptionRequest(), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.details() == (
        "apache.rocketmq.v2.MessagingService/SyncLiteSubscription is not served by Capstan brokers"
    )
    assert_no_traceback(broker.log)


def assert_no_traceback(log: Path) -> None:
    text = log.read_text()
    assert "Traceback" not in text and "NotImplementedError" not in text, text[-3000:]
