"""Capstan's own SDK in the e2e story: a PushConsumer (client-side rebalance, its group's
membership by heartbeats) in a pod of Capstan's image, consuming a topic until SIGTERM.
Every tenth batch it answers RECONSUME_LATER, so the broker takes messages back for a retry.

    python -P sdk_consumer.py ENDPOINT GROUP TOPIC

Lines (tab-separated; the clock is CLOCK_MONOTONIC, as in traffic.py's lines):
`R <clock> <topic> <body>` per message consumed, `L <clock> <topic> <body>` per message
sent back.
It reaches a secured cluster with CAPSTAN_CA, CAPSTAN_ACCESS_KEY and CAPSTAN_SECRET_KEY.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from capstan.client.consumer.push_consumer import PushConsumer
from capstan.client.consumer.settings import ConsumeStatus
from capstan.common.signal_stop import SignalStop
from capstan.security.credentials import client_access


def main() -> None:
    endpoint, group, topic = sys.argv[1:4]
    stop = SignalStop()
    stop.install([signal.SIGTERM])
    batches = [0]
    printing = threading.Lock()

    def listener(messages: Sequence[Any], context: Any) -> ConsumeStatus:
        batches[0] += 1
        later = batches[0] % 10 == 0
        for m in messages:
            body = m.body.decode(errors="replace")
            line = f"{'L' if later else 'R'}\t{time.monotonic()}\t{m.topic}\t{body}\n"
            with printing:  # listeners run on several threads: one whole line at a time
                sys.stdout.write(line)
                sys.stdout.flush()
        return ConsumeStatus.RECONSUME_LATER if later else ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(endpoint, group, listener, **client_access())
    consumer.subscribe(topic)
    consumer.start()
    try:
        stop.wait()
    finally:
        consumer.shutdown()


if __name__ == "__main__":
    main()
