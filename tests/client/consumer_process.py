"""A PushConsumer in a process of its own, for tests that kill consumers.

    python tests/client/consumer_process.py ADDRESS GROUP TOPIC OUT_FILE CLIENT_ID [orderly]

Every consumed message becomes one line of OUT_FILE: "client_id queue_id offset body
unix_time",
written and flushed before the listener returns, so a kill -9 loses no line of a message
whose consumption was acknowledged. Stops cleanly on SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence

from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.received_message import ReceivedMessage
from capstan.client.consumer.settings import (
    ConsumeContext,
    ConsumeFromWhere,
    ConsumerOptions,
    ConsumeStatus,
)


def main() -> None:
    address, group, topic, out_path, client_id = sys.argv[1:6]
    orderly = len(sys.argv) > 6 and sys.argv[6] == "orderly"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = open(out_path, "a", buffering=1)  # noqa: SIM115 - open for the life of the process
    lock = threading.Lock()

    def listener(messages: Sequence[ReceivedMessage], context: ConsumeContext) -> ConsumeStatus:
        with lock:
            for m in messages:
                line = f"{client_id} {m.queue_id} {m.queue_offset} {m.body.decode()} {time.time()}"
                out.write(line + "\n")
            out.flush()
        return ConsumeStatus.CONSUME_SUCCESS

    options = ConsumerOptions(
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        heartbeat_interval_s=1.0,
        persist_offset_interval_s=1.0,
    )
    consumer = PushConsumer(
        [address], group, listener, orderly=orderly, options=options, client_id=client_id
    )
    consumer.subscribe(topic)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer.start()
    print("started", flush=True)
    stop.wait()
    consumer.shutdown()
    out.close()


if __name__ == "__main__":
    main()
