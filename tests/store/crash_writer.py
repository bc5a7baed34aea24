"""Child process of the crash test: append forever with SYNC_FLUSH, report every ack.

Usage: python crash_writer.py ROOT FIRST_ID SEED. Prints `READY`, then one JSON line
[id, topic, queue_id, queue_offset, phys_offset] per acknowledged message, until killed.
"""

from __future__ import annotations

import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from capstan.broker.store.topic_config import TopicConfig
from store.conftest import make_message, open_store

TOPICS = ("Orders", "Payments")
QUEUES = 3


def main() -> None:
    root, first_id, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    store = open_store(pathlib.Path(root), queues=QUEUES)
    store.topics.put(TopicConfig("Payments", QUEUES, QUEUES))
    print("READY", flush=True)
    next_id = first_id
    while True:
        batch = []
        for _ in range(rng.choice((1, 1, 2, 5, 16))):
            topic = rng.choice(TOPICS)
            size = rng.choice((40, 700, 1500, 5000))
            batch.append(
                make_message(next_id, queue_id=rng.randrange(QUEUES), size=size, topic=topic)
            )
            next_id += 1
        result = store.put(batch)
        if not result.status.ok:
            print(json.dumps(["FAILED", result.status.name]), flush=True)
            continue
        lines = [
            json.dumps(
                [int(m.body[8:16]), m.topic, m.queue_id, a.queue_offset, a.phys_offset, len(m.body)]
            )
            for m, a in zip(batch, result.appended, strict=True)
        ]
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
