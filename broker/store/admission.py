"""What the store takes, checked once per message of every write.

Every writer's batch (a client's send, a timer delivery, a transaction commit, a dead
letter, a peer's write) passes here exactly once, before anything of it is written: the
body is 1..`max_body` bytes, the topic exists and takes writes, the queue id is one of its
write queues, and the record encodes and fits a CommitLog segment. A refusal refuses the
whole batch. What passes is an `AdmittedBatch`, its records encoded and ready to append;
appending does not check again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from capstan.broker.store import record as rec
from capstan.broker.store.message import Message
from capstan.broker.store.status import PutResult, PutStatus
from capstan.broker.store.topic_config import TopicConfig


@dataclass(frozen=True, slots=True)
class AdmittedBatch:
    """Records that passed admission, in the order of the messages they encode."""

    records: list[rec.PreparedRecord]

    def pick(self, indexes: Sequence[int]) -> AdmittedBatch:
        """The records of the messages at `indexes` (part of a request goes elsewhere)."""
        return AdmittedBatch([self.records[i] for i in indexes])


def admit(
    messages: Sequence[Message],
    topics: Callable[[str], TopicConfig | None],
    max_body: int,
    max_record: int,
) -> AdmittedBatch | PutResult:
    """The batch encoded, or the refusal of the first message that fails."""
    if not messages:
        return PutResult(PutStatus.MESSAGE_ILLEGAL, detail="empty batch")
    records = []
    seen: dict[str, TopicConfig | None] = {}
    for m in messages:
        if m.topic in seen:
            topic = seen[m.topic]
        else:
            topic = seen[m.topic] = topics(m.topic)
        refusal = _refusal(m, topic, max_body)
        if refusal is not None:
            return refusal
        try:
            record = rec.prepare(m)
        except rec.PropertiesTooLarge as exc:
            return PutResult(PutStatus.PROPERTIES_SIZE_EXCEEDED, detail=str(exc))
        except (rec.RecordTooLarge, ValueError) as exc:
            return PutResult(PutStatus.MESSAGE_ILLEGAL, detail=str(exc))
        if record.size > max_record:
            return PutResult(
                PutStatus.MESSAGE_ILLEGAL,
                detail=f"a record of {record.size} bytes cannot fit a CommitLog segment "
                f"(at most {max_record} bytes)",
            )
        records.append(record)
    return AdmittedBatch(records)


def _refusal(m: Message, topic: TopicConfig | None, max_body: int) -> PutResult | None:
    if not m.body:
        return PutResult(PutStatus.MESSAGE_BODY_EMPTY, detail="message body is empty")
    if len(m.body) > max_body:
        return PutResult(
            PutStatus.MESSAGE_BODY_TOO_LARGE,
            detail=f"body of {len(m.body)} bytes; the limit is {max_body}",
        )
    if topic is None:
        return PutResult(PutStatus.TOPIC_NOT_EXIST, detail=f"topic {m.topic!r} does not exist")
    if not topic.writable:
        return PutResult(PutStatus.NOT_WRITEABLE, detail=f"topic {m.topic!r} is not writable")
    if not 0 <= m.queue_id < topic.write_queue_nums:
        return PutResult(
            PutStatus.QUEUE_NOT_EXIST,
            detail=f"topic {m.topic!r} has no write queue {m.queue_id} "
            f"(0..{topic.write_queue_nums - 1})",
        )
    return None
