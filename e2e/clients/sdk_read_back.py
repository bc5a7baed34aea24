"""Capstan's own SDK reading topics back in the e2e story, at the speed the brokers give:
a LitePullConsumer (capstan.v1 PullMessages) assigned every queue of the topics, reading
each from its first stored message to where it ended when the reader started. The story's
full read-back; the official client reads back a sample (traffic.py's `is_sampled`).

    python -P sdk_read_back.py ENDPOINT GROUP TOPIC[,TOPIC...]

Lines (tab-separated, CLOCK_MONOTONIC as in traffic.py's): `R <clock> <topic> <body>` per
message, `P <clock> <read> <queues still short of their end>` every second (the story
watches them for progress), and `D <clock> <read>` once every queue is read to its end.
It exits 0 then, and non-zero if it fails. It reaches a secured cluster with CAPSTAN_CA,
CAPSTAN_ACCESS_KEY and CAPSTAN_SECRET_KEY.
"""

from __future__ import annotations

import sys
import time

from capstan.client.consumer.lite_pull_consumer import LitePullConsumer
from capstan.client.consumer.settings import ConsumeFromWhere, ConsumerOptions
from capstan.security.credentials import client_access

PROGRESS_EVERY_S = 1.0


def main() -> int:
    endpoint, group, topics = sys.argv[1:4]
    options = ConsumerOptions(consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
    consumer = LitePullConsumer(endpoint, group, options=options, auto_commit=False,
                                **client_access())  # fmt: skip
    queues = [q for topic in topics.split(",") for q in consumer.fetch_message_queues(topic)]
    consumer.assign(queues)
    read = 0
    with consumer:
        ends, short = {}, set()
        for queue in queues:
            first, end = consumer.offset_range(queue)
            consumer.seek(queue, first)
            ends[queue] = end
            if end > first:
                short.add(queue)
        next_progress = 0.0
        while short:
            if time.monotonic() >= next_progress:
                next_progress = time.monotonic() + PROGRESS_EVERY_S
                print(f"P\t{time.monotonic()}\t{read}\t{len(short)}", flush=True)
            lines = []
            for m in consumer.poll(timeout_s=1.0):
                read += 1
                lines.append(f"R\t{time.monotonic()}\t{m.topic}\t{m.body.decode(errors='replace')}")
                if m.queue_offset + 1 >= ends[m.message_queue]:
                    short.discard(m.message_queue)
            if lines:
                print("\n".join(lines), flush=True)
    print(f"D\t{time.monotonic()}\t{read}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
