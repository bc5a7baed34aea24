"""Transactional messages: half messages, commit/rollback, and check-back.

A transactional send stores a half message in `RMQ_SYS_TRANS_HALF_TOPIC` (invisible to
consumers) and answers with a transaction id that names the half message's place. Commit
stores a copy in the real topic; commit and rollback both write an op record to
`RMQ_SYS_TRANS_OP_HALF_TOPIC` whose body is the half message's queue offset. A half
message still undecided after `check_timeout_ms` (or the message's own recovery duration)
is checked back: a RecoverOrphanedTransactionCommand goes to a producer of the topic over
its Telemetry stream, once per check interval, at most `max_checks` times; after that the
half message is moved to `TRANS_CHECK_MAX_TIME_TOPIC`.

`transaction_progress.json` keeps the lowest undecided half offset and the check counts.
On start the op topic is read to learn what was decided.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capstan.broker.relocation import park, unpark
from capstan.broker.store.message import Message, StoredMessage
from capstan.broker.store.message_store import MessageStore
from capstan.broker.store.properties import (
    PROPERTY_CHECK_AFTER_MS,
    PROPERTY_CHECK_TIMES,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TAGS,
    PROPERTY_TRANSACTION_PREPARED,
)
from capstan.broker.store.record import CorruptRecord
from capstan.broker.store.status import PutResult
from capstan.broker.system_topics import CHECK_MAX_TOPIC, HALF_TOPIC, OP_TOPIC
from capstan.common.broker_settings import TransactionSettings
from capstan.common.clock import now_ms
from capstan.common.disk_full import RoutineFailures
from capstan.common.durable_files import replace_durably

log = logging.getLogger(__name__)

Put = Callable[[list[Message]], Awaitable[PutResult]]
CheckBack = Callable[[StoredMessage, Message, str], Awaitable[bool]]
"""(half message, its real-topic form, transaction id) -> whether a producer was asked."""

_OP_DECIDED_TAG = "d"


def transaction_id(queue_offset: int, phys_offset: int) -> str:
    return f"{queue_offset:x}-{phys_offset:x}"


def parse_transaction_id(text: str) -> tuple[int, int] | None:
    parts = text.split("-")
    if len(parts) != 2:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        return None


def to_half(message: Message) -> Message:
    return park(message, HALF_TOPIC, {PROPERTY_TRANSACTION_PREPARED: "true"})


def from_half(half: StoredMessage) -> Message | None:
    drop = (PROPERTY_TRANSACTION_PREPARED, PROPERTY_CHECK_TIMES, PROPERTY_CHECK_AFTER_MS)
    return unpark(half, drop)


class TransactionError(Exception):
    """An EndTransaction that names no undecided half message of this topic."""


@dataclass(frozen=True, slots=True)
class Decision:
    already_decided: bool


class TransactionService:
    def __init__(
        self, store: MessageStore, progress_path: Path, settings: TransactionSettings
    ) -> None:
        self._store = store
        self._path = progress_path
        self._settings = settings
        self._decided: set[int] = set()
        self._checks: dict[int, int] = {}
        self._low = 0
        self._task: asyncio.Task[None] | None = None
        self._put: Put | None = None
        self._check_back: CheckBack | None = None
        self._op_log = True
        self._lock = asyncio.Lock()
        self.version = 0
        """Rises with every progress written (what a master sends its slaves on)."""

    def start(self, put: Put, check_back: CheckBack, op_log: bool = True) -> None:
        """Check and decide with `put` storing committed messages. Without `op_log` (an
        acting master, which stores nothing in its own log) decisions are kept in the
        progress document, written after each, instead of as op records."""
        self._put, self._check_back = put, check_back
        self._op_log = op_log
        self._load()
        self._task = asyncio.create_task(self._check_routine(), name="transaction-check")

    async def stop(self) -> None:
        """Stop checking and write the progress down (if it ever started here)."""
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        self._put = None
        self._save()

    def _load(self) -> None:
        try:
            data = json.loads(self._path.read_text())
            self._low = int(data["offset"])
            self._checks = {int(k): int(v) for k, v in data.get("checks", {}).items()}
            self._decided = {int(o) for o in data.get("decided", [])}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("transaction progress unreadable (%s); checking from the start", exc)
        self._read_ops()

    def _read_ops(self) -> None:
        bounds = self._store.queue_bounds(OP_TOPIC, 0)
        if bounds is None:
            return
        offset, end = bounds
        while offset < end:
            result = self._store.get(OP_TOPIC, 0, offset, 256)
            for m in result.messages:
                text = m.body.decode(errors="replace")
                if text.isdigit() and int(text) >= self._low:
                    self._decided.add(int(text))
            if result.next_begin_offset <= offset:
                break
            offset = result.next_begin_offset

    def _save(self) -> None:
        replace_durably(self._path, json.dumps(self.progress()).encode())
        self.version += 1

    def progress(self) -> dict[str, Any]:
        """The lowest undecided half offset, the check counts and the decisions above it
        (also in the op records, unless taken without a log), as kept on disk."""
        return {
            "offset": self._low,
            "checks": {str(k): v for k, v in self._checks.items()},
            "decided": sorted(self._decided),
        }

    def adopt_progress(self, document: dict[str, Any]) -> None:
        """A slave takes its master's progress, to check from there once promoted."""
        if self._task is not None:
            raise RuntimeError("transaction checks run here; they take no progress from elsewhere")
        self._low = int(document["offset"])
        self._checks = {int(k): int(v) for k, v in document.get("checks", {}).items()}
        self._decided = {int(o) for o in document.get("decided", [])}
        self._save()

    @property
    def pending(self) -> int:
        bounds = self._store.queue_bounds(HALF_TOPIC, 0)
        if bounds is None:
            return 0
        return max(0, bounds[1] - max(self._low, bounds[0]) - len(self._decided))

    async def prepare(self, messages: list[Message]) -> tuple[PutResult, list[str]]:
        """Store half messages; returns the result and one transaction id per message."""
        assert self._put is not None
        result = await self._put([to_half(m) for m in messages])
        ids = [transaction_id(a.queue_offset, a.phys_offset) for a in result.appended]
        return result, ids

    def _half_message(self, topic: str, message_id: str, tx_id: str) -> StoredMessage:
        place = parse_transaction_id(tx_id)
        if place is None:
            raise TransactionError(f"transaction id {tx_id!r} is malformed")
        queue_offset, phys = place
        try:
            half = self._store.read_message(phys)
        except CorruptRecord:
            half = None
        if (
            half is None
            or half.topic != HALF_TOPIC
            or half.queue_offset != queue_offset
            or half.properties.get(PROPERTY_REAL_TOPIC) != topic
            or (message_id and half.msg_id != message_id)
        ):
            raise TransactionError(
                f"no transactional message {message_id!r} of topic {topic!r} "
                f"has transaction id {tx_id!r}"
            )
        return half

    def check_known(self, topic: str, message_id: str, tx_id: str) -> None:
        """Raise TransactionError unless `tx_id` names a half message of `topic`."""
        self._half_message(topic, message_id, tx_id)

    async def end(self, topic: str, message_id: str, tx_id: str, commit: bool) -> Decision:
        """Commit or roll back; idempotent for a transaction already decided."""
        if self._put is None:
            raise TransactionError("this broker does not decide transactions now (not the master)")
        half = self._half_message(topic, message_id, tx_id)
        async with self._lock:
            # Below the low mark everything is decided (checks moved past it).
            if half.queue_offset < self._low or half.queue_offset in self._decided:
                return Decision(already_decided=True)
            await self._decide(half, commit)
        return Decision(already_decided=False)

    async def _decide(self, half: StoredMessage, commit: bool, to_topic: str = "") -> None:
        assert self._put is not None
        if commit:
            restored = from_half(half)
            if restored is None:
                raise TransactionError("half message lacks its real topic")
            restored.properties[PROPERTY_PREPARED_QUEUE_OFFSET] = str(half.queue_offset)
            if to_topic:
                restored.properties[PROPERTY_REAL_TOPIC] = restored.topic
                restored.topic, restored.queue_id = to_topic, 0
            if not self._committed_before(restored, half):
                result = await self._put([restored])
                if not result.status.ok:
                    raise RuntimeError(f"storing the committed message failed: {result.detail}")
        if self._op_log:
            op = Message(
                topic=OP_TOPIC,
                queue_id=0,
                body=str(half.queue_offset).encode(),
                properties={PROPERTY_TAGS: _OP_DECIDED_TAG},
            )
            result = await self._put([op])
            if not result.status.ok:
                raise RuntimeError(f"storing the op record failed: {result.detail}")
        self._decided.add(half.queue_offset)
        self._checks.pop(half.queue_offset, None)
        if not self._op_log:
            await asyncio.to_thread(self._save)

    def _committed_before(self, restored: Message, half: StoredMessage) -> bool:
        """Whether a commit of `half` is stored already without its op record: a master
        that died between the two, or an acting master whose progress did not reach the
        master that took over. Committing again would deliver the message twice."""
        msg_id = half.msg_id
        if not msg_id:
            return False
        copies = self._store.query_by_key(restored.topic, msg_id, max_results=16)
        mark = str(half.queue_offset)
        return any(c.properties.get(PROPERTY_PREPARED_QUEUE_OFFSET) == mark for c in copies)

    async def _check_routine(self) -> None:
        failures = RoutineFailures(log, "transaction checks")
        while True:
            await asyncio.sleep(self._settings.check_interval_ms / 1000)
            try:
                await self.check_once()
            except Exception as exc:  # noqa: BLE001 - the routine retries whatever failed
                failures.failed(exc)
            else:
                failures.succeeded()

    async def check_once(self) -> int:
        """One pass over undecided half messages; returns how many producers were asked."""
        assert self._check_back is not None
        bounds = self._store.queue_bounds(HALF_TOPIC, 0)
        if bounds is None:
            return 0
        offset, end = max(self._low, bounds[0]), bounds[1]
        asked, now, low = 0, now_ms(), None
        while offset < end:
            result = self._store.get(HALF_TOPIC, 0, offset, 64)
            for half in result.messages:
                async with self._lock:
                    if half.queue_offset in self._decided:
                        continue
                    if low is None:
                        low = half.queue_offset
                    question = await self._check_one_locked(half, now)
                if question is not None:  # asked outside the lock: EndTransaction takes it
                    asked += int(await self._check_back(half, *question))
            if result.next_begin_offset <= offset:
                break  # e.g. half messages the in-sync slaves do not hold yet: unread
            offset = result.next_begin_offset
        # The mark stops at the first undecided half message seen, and never passes one
        # the scan could not read: moving past it would count it decided unchecked.
        self._advance(low if low is not None else min(offset, end))
        await asyncio.to_thread(self._save)
        return asked

    async def _check_one_locked(self, half: StoredMessage, now: int) -> tuple[Message, str] | None:
        """Count a check of `half` if it is due (moving it to the check-max topic after
        the last); what to ask its producer (real-topic form, transaction id), None when
        nothing is to be asked now."""
        wait_ms = self._settings.check_timeout_ms
        own = half.properties.get(PROPERTY_CHECK_AFTER_MS)
        if own is not None and own.isdigit():
            wait_ms = int(own)
        if now - half.store_timestamp_ms < wait_ms:
            return None
        checks = self._checks.get(half.queue_offset, 0)
        if checks >= self._settings.max_checks:
            log.warning(
                "transaction %s unanswered after %d checks; moving it to %s",
                half.msg_id,
                checks,
                CHECK_MAX_TOPIC,
            )
            await self._decide(half, commit=True, to_topic=CHECK_MAX_TOPIC)
            return None
        restored = from_half(half)
        if restored is None:
            return None
        # A check counts even when no producer is connected to answer it, so an orphan
        # whose producer is gone for good still ends in the check-max topic.
        self._checks[half.queue_offset] = checks + 1
        return restored, transaction_id(half.queue_offset, half.phys_offset)

    def _advance(self, low: int) -> None:
        self._low = low
        self._decided = {o for o in self._decided if o >= low}
        self._checks = {o: n for o, n in self._checks.items() if o >= low}
