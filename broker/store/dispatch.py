"""Dispatch: turning appended records into consume-queue units and index entries.

The append path dispatches inline (it already knows every field). If that fails, say a
consume-queue write hits a full disk, the store falls behind and `catch_up` re-reads the
CommitLog from the last dispatched offset, as recovery does, until it is level again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from capstan.broker.store.consume_queue import ConsumeQueueStore
from capstan.broker.store.index import IndexService
from capstan.broker.store.message import queue_tag_code
from capstan.broker.store.properties import KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from capstan.broker.store.record import PreparedRecord


def index_key(topic: str, key: str) -> str:
    """How the index names a message key or message id: keys are per topic."""
    return f"{topic}#{key}"


def add_index_entries(
    out: list[tuple[str, int, int]],
    topic: str,
    properties: Mapping[str, str],
    phys_offset: int,
    store_timestamp_ms: int,
) -> None:
    """Append the index entries of one message to `out`: its message id and each key."""
    uniq = properties.get(PROPERTY_UNIQ_KEY)
    if uniq:
        out.append((index_key(topic, uniq), phys_offset, store_timestamp_ms))
    keys = properties.get(PROPERTY_KEYS)
    if keys:
        out.extend(
            (index_key(topic, k), phys_offset, store_timestamp_ms)
            for k in keys.split(KEY_SEPARATOR)
            if k
        )


QueueEntry = tuple[str, int, int, int, int, int]
"""(topic, queue_id, queue_offset, phys_offset, size, tag_hash)"""


def dispatch_appended(
    queues: ConsumeQueueStore,
    index: IndexService | None,
    records: Sequence[PreparedRecord],
    queue_offsets: Sequence[int],
    positions: Sequence[int],
    sizes: Sequence[int],
    store_timestamp_ms: int,
) -> None:
    """Write queue units and index entries for records just appended (append lock held):
    each at its position and stored size (a batch entry's own)."""
    entries: list[QueueEntry] = []
    keys: list[tuple[str, int, int]] = []
    for record, queue_offset, phys, size in zip(
        records, queue_offsets, positions, sizes, strict=True
    ):
        m = record.message
        if m.sys_flag and m.is_prepared_transaction:
            continue
        props = m.properties
        entries.append(
            (
                m.topic,
                m.queue_id,
                queue_offset,
                phys,
                size,
                queue_tag_code(props),
            )
        )
        if index is not None:
            add_index_entries(keys, m.topic, props, phys, store_timestamp_ms)
    queues.dispatch(entries)
    if keys and index is not None:
        index.put_many(keys)
