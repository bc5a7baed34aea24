"""A PushConsumer in a process of its own, for tests that kill or stop consumers.

    python tests/client/consumer_process.py ADDRESS GROUP TOPIC OUT_FILE CLIENT_ID \
        [orderly] [OPTION=VALUE ...]

OPTION=VALUE sets a float field of ConsumerOptions (e.g. rebalance_interval_s=3600).
Every consumed message becomes one line of OUT_FILE: "client_id queue_id offset body
unix_time", written and flushed before the listener returns, so a kill -9 loses no line
of a message whose consumption was acknowledged. Stops cleanly on SIGTERM, and then prints
how many rebalances each trigger started: "rebalances start=1 notify=3 timer=0".
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
from capstan.client.metrics import ConsumerMetrics
from capstan.common.signal_stop import SignalStop

FLOAT_OPTIONS = {
    "rebalance_interval_s",
    "heartbeat_interval_s",
    "persist_offset_interval_s",
    "lock_renew_interval_s",
}


def parse_options(args: Sequence[str]) -> tuple[bool, dict[str, float]]:
    orderly = False
    options: dict[str, float] = {}
    for arg in args:
        if arg == "orderly":
            orderly = True
            continue
        name, _, value = arg.partition("=")
        if name not in FLOAT_OPTIONS:
            raise SystemExit(f"unknown option {arg!r}")
        options[name] = float(value)
    return orderly, options


def rebalance_counts(metrics: ConsumerMetrics) -> dict[str, int]:
    counts = {"start": 0, "notify": 0, "timer": 0}
    for metric in metrics.registry.collect():
        if metric.name == "capstan_rebalances":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["trigger"]] = int(sample.value)
    return counts


def main() -> None:
    address, group, topic, out_path, client_id = sys.argv[1:6]
    orderly, overrides = parse_options(sys.argv[6:])
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

    settings: dict[str, float] = {
        "heartbeat_interval_s": 1.0,
        "persist_offset_interval_s": 1.0,
        **overrides,
    }
    options = ConsumerOptions(consume_from_where=ConsumeFromWhere.FIRST_OFFSET, **settings)
    consumer = PushConsumer(
        [address], group, listener, orderly=orderly, options=options, client_id=client_id
    )
    consumer.subscribe(topic)
    stop = SignalStop()
    stop.install([signal.SIGTERM])
    consumer.start()
    print("started", flush=True)
    stop.wait()
    consumer.shutdown()
    out.close()
    counts = rebalance_counts(consumer.metrics)
    print("rebalances " + " ".join(f"{k}={v}" for k, v in counts.items()), flush=True)


if __name__ == "__main__":
    main()
