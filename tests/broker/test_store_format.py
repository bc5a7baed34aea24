"""The broker store under the stored-format rule (capstan/common/data_format.py), through the
real broker process: a store from before formats were numbered opens with its messages and
is marked; a store a newer Capstan marked is refused at start, in one line, untouched."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from capstan import __version__
from tests.broker.broker_process import BrokerProcess
from tests.broker.test_official_client import produce


def test_an_unmarked_store_keeps_its_messages_and_a_newer_one_is_refused(tmp_path) -> None:
    broker = BrokerProcess(tmp_path).start()
    try:
        broker.create_topic("T")
        produce(broker, "T", [b"one", b"two", b"three"])
        ends = broker.queue_ends("T")
    finally:
        broker.stop()
    store = tmp_path / "data" / "store"
    marker = store / "FORMAT"
    assert json.loads(marker.read_text()) == {
        "kind": "broker store",
        "format": 1,
        "written_by": __version__,
    }

    marker.unlink()  # as Capstan 0.1.0 left its stores
    broker.start()
    try:
        assert broker.queue_ends("T") == ends and sum(ends) == 3
    finally:
        broker.stop()
    assert json.loads(marker.read_text())["format"] == 1

    newer = '{"kind": "broker store", "format": 7, "written_by": "3.1.0"}\n'
    marker.write_text(newer)
    before = sorted((p.relative_to(store), p.stat().st_size) for p in store.rglob("*"))
    refused = subprocess.run(
        [sys.executable, "-m", "capstan.cli", "broker", "--config", str(broker.config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert refused.returncode != 0
    assert "format 7, written by Capstan 3.1.0" in refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert marker.read_text() == newer
    assert sorted((p.relative_to(store), p.stat().st_size) for p in store.rglob("*")) == before
