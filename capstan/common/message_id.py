"""Producer-side message ids in the layout RocketMQ 5 clients use: "01" then 16 bytes in
upper-case hex — 6 bytes of MAC address, the low 2 bytes of the pid, seconds since
2021-01-01 UTC (4 bytes) and a per-process sequence number (4 bytes)."""

from __future__ import annotations

import itertools
import os
import struct
import threading
import time
import uuid

_EPOCH_2021_S = 1_609_459_200
_PREFIX = uuid.getnode().to_bytes(6, "big") + struct.pack(">H", os.getpid() & 0xFFFF)
_counter = itertools.count()
_lock = threading.Lock()


def new_message_id() -> str:
    with _lock:
        seq = next(_counter) & 0xFFFFFFFF
    seconds = (int(time.time()) - _EPOCH_2021_S) & 0xFFFFFFFF
    return "01" + (_PREFIX + struct.pack(">II", seconds, seq)).hex().upper()
