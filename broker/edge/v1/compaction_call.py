"""capstan.v1.Admin/CompactTopic: a compaction manifest streamed in, swapped in whole.

The header opens a CompactionSession (broker/store/compaction_session.py), each batch of
kept records is checked and copied on a worker thread as it arrives, and the trailer's digest
decides the swap; a retention round then gives the superseded CommitLog segments back. A
stream that ends early, is cancelled or carries a bad record leaves the topic as it was.

A slave may already hold the job's copy, taken from its master by replication while the
job was still sending to the master: then the reply names that generation and nothing is
swapped again, so the replicas' generations stay equal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc

from capstan.broker.store.compaction import AlreadyCompacted, CompactionRefused
from capstan.broker.store.compaction_session import CompactionSession
from capstan.broker.store.message_store import MessageStore
from capstan.common.compaction_manifest import KeptRecord, ManifestError, QueueCut
from capstan.common.grpc_abort import abort
from capstan.v1 import admin_pb2 as pb

log = logging.getLogger(__name__)


async def compact_topic(
    store: MessageStore, chunks: AsyncIterator[pb.CompactionChunk], context: Any
) -> pb.CompactionReply:
    session: CompactionSession | None = None
    try:
        async for chunk in chunks:
            part = chunk.WhichOneof("part")
            if part == "header":
                if session is not None:
                    raise ManifestError("a second header in one manifest")
                try:
                    session = await _open(store, chunk.header)
                except AlreadyCompacted as exc:
                    log.info("compaction of %s: %s", chunk.header.topic, exc)
                    return _live_copy(store, chunk.header.topic, exc.generation)
            elif session is None:
                raise ManifestError(f"{part or 'an empty chunk'} before the header")
            elif part == "kept":
                records = [
                    KeptRecord(r.queue_id, r.queue_offset, r.key, r.body_crc)
                    for r in chunk.kept.records
                ]
                await asyncio.to_thread(session.add, records)
            elif part == "trailer":
                return await _finish(store, session, chunk.trailer)
            else:
                raise ManifestError("an empty chunk")
        raise ManifestError("the manifest ended without its trailer: nothing was changed")
    except ManifestError as exc:
        await abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except CompactionRefused as exc:
        await abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except OSError as exc:
        log.exception("compaction failed on a file operation")
        await abort(context, grpc.StatusCode.INTERNAL, f"compaction failed: {exc}")
    finally:
        if session is not None:
            session.abandon()  # nothing once swapped


async def _open(store: MessageStore, header: pb.CompactionHeader) -> CompactionSession:
    """The session for `header`, opened on a worker thread (it may wait for another swap of
    the topic). A call cancelled meanwhile (the job died) abandons the session once the thread
    has made it: else its generation directory stayed and the topic stayed reserved."""
    cuts = [QueueCut(c.queue_id, c.boundary) for c in header.cuts]
    log.info("compaction of %s (job %r) begins: %d queues", header.topic, header.job, len(cuts))
    opening = asyncio.ensure_future(
        asyncio.to_thread(CompactionSession, store, header.topic, cuts, header.job)
    )
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_abandon_opened)
        raise


def _abandon_opened(opening: asyncio.Future[CompactionSession]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        return  # nothing was reserved
    session = opening.result()
    log.info("compaction of %s: the call ended while it opened; abandoned", session.topic)
    asyncio.get_running_loop().run_in_executor(None, session.abandon)


def _live_copy(store: MessageStore, topic: str, generation: int) -> pb.CompactionReply:
    return pb.CompactionReply(
        generation=generation,
        queues=[
            pb.CompactedQueue(
                queue_id=q, boundary=view.boundary, kept=view.kept, dropped=0, bytes=view.size
            )
            for q, view in sorted(store.compacted.views(topic).items())
        ],
    )


async def _finish(
    store: MessageStore, session: CompactionSession, trailer: pb.CompactionTrailer
) -> pb.CompactionReply:
    generation, outcomes = await asyncio.to_thread(
        session.finish, trailer.sha256, trailer.record_count
    )
    retention = await asyncio.to_thread(store.retention_round)
    log.info(
        "compaction of %s: generation %d swapped in (%d kept, %d dropped); %d CommitLog "
        "bytes freed",
        session.topic,
        generation,
        sum(o.kept for o in outcomes),
        sum(o.dropped for o in outcomes),
        retention.bytes_freed,
    )
    return pb.CompactionReply(
        generation=generation,
        queues=[
            pb.CompactedQueue(
                queue_id=o.queue_id,
                boundary=o.boundary,
                kept=o.kept,
                dropped=o.dropped,
                bytes=o.bytes,
            )
            for o in outcomes
        ],
        commitlog_bytes_freed=retention.bytes_freed,
    )
