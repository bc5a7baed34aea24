"""A transaction is committed once even when the master that committed it died before its
op record: the next master finds the half message undecided, checks back, and is told
"commit" again; it records the decision without storing the message a second time. And a
check pass never counts as decided a half message it could not read yet."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Awaitable, Callable

from capstan.broker.store.message import Message, StoredMessage
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import PROPERTY_UNIQ_KEY
from capstan.broker.store.status import PutResult, PutStatus
from capstan.broker.store.topic_config import TopicConfig
from capstan.broker.system_topics import OP_TOPIC, system_topic_configs
from capstan.broker.transaction.transaction_service import TransactionService
from capstan.common.broker_settings import TransactionSettings
from tests.store.conftest import small_settings

TOPIC = "Pay"
SETTINGS = TransactionSettings(check_timeout_ms=0, check_interval_ms=3_600_000, max_checks=5)


def open_store(root: pathlib.Path) -> MessageStore:
    store = MessageStore(root, small_settings(), disk_usage=lambda _: 0.1)
    for config in [*system_topic_configs(), TopicConfig(TOPIC, 1, 1)]:
        if store.topics.get(config.name) is None:
            store.topics.put(config)
    return store


def storing_into(store: MessageStore) -> Callable[[list[Message]], Awaitable[PutResult]]:
    async def put(messages: list[Message]) -> PutResult:
        return store.put(messages)

    return put


def producer_answering(asked: list[str]) -> Callable[..., Awaitable[bool]]:
    """A producer that is reached by every check; the checked ids land in `asked`."""

    async def check_back(half: StoredMessage, _: Message, tx: str) -> bool:
        asked.append(tx)
        return True

    return check_back


def bodies(store: MessageStore, topic: str) -> list[bytes]:
    return [m.body for m in store.get(topic, 0, 0, max_messages=32).messages]


def test_a_commit_stored_without_its_op_record_is_not_stored_again(tmp_path: pathlib.Path):
    asked: list[str] = []

    async def scenario() -> None:
        with open_store(tmp_path / "store") as store:
            put, producer_says_commit = storing_into(store), producer_answering(asked)

            async def dies_before_the_op_record(messages: list[Message]) -> PutResult:
                if messages[0].topic == OP_TOPIC:
                    return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, detail="killed")
                return store.put(messages)

            first = TransactionService(store, tmp_path / "first.json", SETTINGS)
            first.start(dies_before_the_op_record, producer_says_commit)
            half = Message(TOPIC, 0, b"pay 10", {PROPERTY_UNIQ_KEY: "7F000001ABCD"})
            _, [tx] = await first.prepare([half])
            try:
                await first.end(TOPIC, "7F000001ABCD", tx, commit=True)
            except RuntimeError:
                pass  # the op record was never stored
            await first.stop()
            assert bodies(store, TOPIC) == [b"pay 10"]

            # The next master: no op record, so the half message is in doubt and checked.
            second = TransactionService(store, tmp_path / "second.json", SETTINGS)
            second.start(put, producer_says_commit)
            assert await second.check_once() == 1
            assert asked == [tx]
            decision = await second.end(TOPIC, "7F000001ABCD", tx, commit=True)
            assert not decision.already_decided
            assert bodies(store, TOPIC) == [b"pay 10"]  # recorded, not stored twice
            assert second.pending == 0
            again = await second.end(TOPIC, "7F000001ABCD", tx, commit=True)
            assert again.already_decided
            await second.stop()

    asyncio.run(scenario())


def test_a_half_message_the_slaves_do_not_hold_yet_is_checked_once_they_do(
    tmp_path: pathlib.Path,
):
    """A master reads only what its in-sync slaves hold (the store's read limit). A check
    pass that meets a half message above that limit must leave it for a later pass, not
    count it decided: its producer would never be asked and the transaction never end."""
    asked: list[str] = []

    async def scenario() -> None:
        with open_store(tmp_path / "store") as store:
            service = TransactionService(store, tmp_path / "progress.json", SETTINGS)
            service.start(storing_into(store), producer_answering(asked))
            confirmed = store.max_phys_offset
            _, [tx] = await service.prepare([Message(TOPIC, 0, b"pay 10")])
            store.read_limit = confirmed  # the slaves have not confirmed the half message
            assert await service.check_once() == 0
            assert service.pending == 1
            store.read_limit = store.max_phys_offset  # now they have
            assert await service.check_once() == 1
            assert asked == [tx]
            decision = await service.end(TOPIC, "", tx, commit=False)
            assert not decision.already_decided
            await service.stop()

    asyncio.run(scenario())
