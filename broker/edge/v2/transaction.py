"""EndTransaction: a producer commits or rolls back a half message, or says it does not
know yet (left for the broker's check-back)."""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc

from capstan.broker.edge.v2 import validation
from capstan.broker.edge.v2.codes import RequestError, ok
from capstan.broker.transaction.transaction_service import TransactionError, TransactionService


class TransactionHandler:
    def __init__(self, transactions: TransactionService) -> None:
        self._transactions = transactions

    async def end(
        self, request: svc.EndTransactionRequest, context: grpc.aio.ServicerContext
    ) -> svc.EndTransactionResponse:
        topic = validation.topic_name(request.topic)
        if not request.transaction_id.strip():
            raise RequestError(pb.INVALID_TRANSACTION_ID, "transaction_id is blank")
        try:
            if request.resolution == pb.TRANSACTION_RESOLUTION_UNSPECIFIED:
                # "Unknown": keep the half message; the broker will check back.
                self._transactions.check_known(topic, request.message_id, request.transaction_id)
                return svc.EndTransactionResponse(status=ok("left for check-back"))
            decision = await self._transactions.end(
                topic,
                request.message_id,
                request.transaction_id,
                commit=request.resolution == pb.COMMIT,
            )
        except TransactionError as exc:
            raise RequestError(pb.INVALID_TRANSACTION_ID, str(exc)) from None
        note = "already decided" if decision.already_decided else "OK"
        return svc.EndTransactionResponse(status=ok(note))
