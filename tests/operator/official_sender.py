"""Sends with the official RocketMQ 5 producer (rocketmq-python-client) until a stop file
appears. The operator's tests run it inside the test kubelet's hosts namespace, so it
starts from a Service's name and reaches the brokers by the DNS names routes give.

    python -P tests/operator/official_sender.py ENDPOINT TOPIC OUT STOP_FILE

Each send appends `<CLOCK_MONOTONIC seconds>\t<1 acknowledged | 0 failed>` to OUT (the
clock is the machine's, so the test can line sends up with what it saw happen)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from rocketmq import ClientConfiguration, Credentials, Message, Producer


def main(endpoint: str, topic: str, out: Path, stop: Path) -> None:
    producer = Producer(ClientConfiguration(endpoint, Credentials(), request_timeout=3), (topic,))
    producer.startup()
    n = 0
    try:
        with out.open("a") as log:
            while not stop.exists():
                message = Message()
                message.topic = topic
                message.body = f"rolling-{n}".encode()
                n += 1
                try:
                    producer.send(message)
                    ok = 1
                except Exception:  # noqa: BLE001 - the client raises its own error types
                    ok = 0
                log.write(f"{time.monotonic()}\t{ok}\n")
                log.flush()
                time.sleep(0.01)
    finally:
        producer.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
