"""Replacing a file durably from several threads at once: every call succeeds and the
file always holds one whole payload, never a mix and never nothing."""

from __future__ import annotations

import pathlib
import threading

from capstan.common.durable_files import replace_durably


def test_threads_replacing_one_file_take_turns(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "state"
    payloads = [bytes([n]) * 4096 for n in range(4)]
    failures: list[BaseException] = []

    def writer(payload: bytes) -> None:
        try:
            for _ in range(100):
                replace_durably(target, payload)
                assert target.read_bytes() in payloads
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert target.read_bytes() in payloads
    assert not (tmp_path / "state.tmp").exists()
