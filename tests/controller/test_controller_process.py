"""`capstan controller` as a real process: it takes the lead, elects a first master, replaces
a master whose heartbeats stop with a SyncStateSet member (fencing it with a new epoch),
serves its metrics, and a second replica sharing the state refuses while the first leads."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from capstan.v1 import controller_pb2 as pb
from capstan.v1 import controller_pb2_grpc as pb_grpc
from tests.controller.controller_process import ControllerProcess
from tests.waiting import wait_until


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[ControllerProcess]:
    process = ControllerProcess(tmp_path / "c1", tmp_path / "state").start()
    try:
        yield process
    finally:
        process.stop()


class Beater:
    """Heartbeats for one broker on a thread until stopped, as a broker would send them."""

    def __init__(self, stub: pb_grpc.ControllerStub, group: str, broker_id: int, address: str):
        self.info: pb.ReplicaInfo | None = None
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.is_set():
                request = pb.BrokerHeartbeatRequest(
                    group=group, broker_id=broker_id, address=address, epoch=1, max_offset=0
                )
                try:
                    self.info = stub.BrokerHeartbeat(request, timeout=2).info
                except grpc.RpcError:
                    pass
                self._stop.wait(0.2)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@contextlib.contextmanager
def two_beating_in_sync(
    controller: ControllerProcess,
) -> Iterator[tuple[pb_grpc.ControllerStub, dict[int, Beater], pb.ReplicaInfo, int]]:
    """Group g of two brokers heartbeating, a master elected and both in its SyncStateSet:
    (stub, beater by broker id, the group's info, the master's in-sync peer)."""
    stub = controller.stub()
    wait_until(lambda: controller.status().leader, 10, "the controller to lead")
    first = stub.RegisterBroker(
        pb.RegisterBrokerRequest(group="g", address="127.0.0.1:1", identity="a"), timeout=5
    )
    second = stub.RegisterBroker(
        pb.RegisterBrokerRequest(group="g", address="127.0.0.1:2", identity="b"), timeout=5
    )
    beaters = {
        first.broker_id: Beater(stub, "g", first.broker_id, "127.0.0.1:1"),
        second.broker_id: Beater(stub, "g", second.broker_id, "127.0.0.1:2"),
    }
    try:
        wait_until(
            lambda: stub.GetReplicaInfo(pb.GetReplicaInfoRequest(group="g")).master_id > 0,
            10,
            "a first master",
        )
        info = stub.GetReplicaInfo(pb.GetReplicaInfoRequest(group="g"))
        master = info.master_id
        other = second.broker_id if master == first.broker_id else first.broker_id
        grown = stub.AlterSyncStateSet(
            pb.AlterSyncStateSetRequest(
                group="g",
                proposer_id=master,
                master_epoch=info.master_epoch,
                sync_state_set_epoch=info.sync_state_set_epoch,
                new_sync_state_set=[master, other],
            )
        )
        assert grown.accepted, grown.reason
        yield stub, beaters, info, other
    finally:
        for beater in beaters.values():
            beater.stop()


def test_a_dead_master_is_replaced_by_a_sync_state_set_member(controller):
    with two_beating_in_sync(controller) as (stub, beaters, info, other):
        master = info.master_id
        beaters[master].stop()  # the master dies
        wait_until(
            lambda: stub.GetReplicaInfo(pb.GetReplicaInfoRequest(group="g")).master_id == other,
            10,
            "the other broker to be elected",
        )
        after = stub.GetReplicaInfo(pb.GetReplicaInfoRequest(group="g"))
        assert after.master_epoch > info.master_epoch  # the old master is fenced
        assert list(after.sync_state_set) == [other]
        metrics = (
            urllib.request.urlopen(f"http://127.0.0.1:{controller.http_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        assert 'capstan_controller_elections_total{group="g"}' in metrics
        assert "capstan_controller_leader 1.0" in metrics
        # The dead master is named, the new one alive (figures refreshed at each check).
        url = f"http://127.0.0.1:{controller.http_port}/metrics"
        wanted = (
            f'capstan_controller_replica_alive{{broker_id="{master}",group="g"}} 0.0',
            f'capstan_controller_replica_alive{{broker_id="{other}",group="g"}} 1.0',
        )

        def shown() -> bool:
            page = urllib.request.urlopen(url, timeout=5).read().decode()
            return all(w in page for w in wanted)

        wait_until(shown, 5, "the replicas' liveness on /metrics")


def test_a_paused_controller_gives_the_brokers_a_fresh_grace_before_judging_them(controller):
    """A controller frozen for longer than broker_timeout_ms (a stopped process, a VM
    pause) missed heartbeats that brokers did send: on waking it must not take their
    silence for death and move the master."""
    with two_beating_in_sync(controller) as (stub, _, info, other):
        assert controller.proc is not None
        controller.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(3.0)  # twice broker_timeout_ms
        finally:
            controller.proc.send_signal(signal.SIGCONT)
        time.sleep(3.0)  # the grace after waking, and more
        after = stub.GetReplicaInfo(pb.GetReplicaInfoRequest(group="g"), timeout=5)
        assert (after.master_id, after.master_epoch) == (info.master_id, info.master_epoch)
        assert sorted(after.sync_state_set) == sorted([info.master_id, other])


def test_a_second_replica_on_the_same_state_refuses_until_the_leader_stops(tmp_path: Path):
    state = tmp_path / "state"
    one = ControllerProcess(tmp_path / "c1", state).start()
    two = ControllerProcess(tmp_path / "c2", state).start()
    try:
        wait_until(lambda: one.status().leader, 10, "the first to lead")
        with pytest.raises(grpc.RpcError) as refused:
            two.stub().RegisterBroker(
                pb.RegisterBrokerRequest(group="g", address="127.0.0.1:1", identity="a"),
                timeout=5,
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        one.stop()  # resigns its lease
        wait_until(lambda: two.status().leader, 10, "the second to take over")
    finally:
        one.stop()
        two.stop()


def _leads(controller: ControllerProcess) -> bool:
    try:
        return bool(controller.status().leader)
    except grpc.RpcError:  # not listening yet
        return False


def test_a_controller_killed_and_started_again_on_its_port_leads_at_once(tmp_path: Path):
    """Its lease names its host, listen host and port, which no other process can hold
    while it runs: started again after kill -9, it leads long before the lease it left
    would lapse, and a second replica on another port still waits that lease out."""
    state = tmp_path / "state"
    one = ControllerProcess(tmp_path / "c1", state, lease_duration_s=60).start()
    two = ControllerProcess(tmp_path / "c2", state, lease_duration_s=60).start()
    try:
        wait_until(lambda: one.status().leader, 10, "the first to lead")
        assert one.proc is not None
        one.proc.kill()
        one.proc.wait(10)
        killed = time.monotonic()
        one.start()
        wait_until(lambda: _leads(one), 30, "the restarted controller to lead again")
        assert time.monotonic() - killed < 30  # the lease it left had 60 s to run
        assert not two.status().leader
    finally:
        one.stop()
        two.stop()


def test_an_unknown_config_key_is_refused_by_name(tmp_path: Path):
    config = tmp_path / "c.yaml"
    config.write_text("grpc_port: 0\nbroker_timeout: 5\n")
    done = subprocess.run(
        [sys.executable, "-m", "capstan.cli", "controller", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert done.returncode == 2
    assert "broker_timeout" in done.stderr


def test_every_setting_is_documented():
    import dataclasses

    from capstan.common.security_settings import TlsSettings
    from capstan.controller.settings import (
        ControllerAuthSettings,
        ControllerSettings,
        StateSettings,
    )

    text = (Path(__file__).parents[2] / "docs" / "controller.md").read_text()
    sections = (
        ("", ControllerSettings),
        ("state.", StateSettings),
        ("tls.", TlsSettings),
        ("auth.", ControllerAuthSettings),
    )
    missing = [
        f"{prefix}{f.name}"
        for prefix, cls in sections
        for f in dataclasses.fields(cls)
        if f.name not in ("state", "tls", "auth") and f"`{prefix}{f.name}`" not in text
    ]
    assert missing == []


def test_state_a_newer_capstan_wrote_is_refused_and_older_state_moves_forward(tmp_path: Path):
    """The stored-format rule (capstan/common/data_format.py) on the controller's state: a
    document of a format this controller does not know is refused at start with one clear
    line, untouched; one written before formats were numbered is kept and stamped."""
    state = tmp_path / "state"
    state.mkdir()
    newer = {"groups": {}, "brokers": {}, "format": 99, "written_by": "9.0.0"}
    stored = json.dumps({"version": 4, "document": newer})
    (state / "controller-state.json").write_text(stored)
    refused = subprocess.run(
        [*(sys.executable, "-m", "capstan.cli", "controller"),
         *("--config", str(ControllerProcess(tmp_path / "c1", state).config))],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )  # fmt: skip
    assert refused.returncode != 0
    assert "format 99, written by Capstan 9.0.0" in refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert (state / "controller-state.json").read_text() == stored

    older = {"groups": {}, "brokers": {}, "static_topics": {}}  # no format: as 0.1.0 wrote it
    (state / "controller-state.json").write_text(json.dumps({"version": 4, "document": older}))
    moved = ControllerProcess(tmp_path / "c2", state).start()
    try:
        wait_until(lambda: moved.status().leader, 10, "it leads")

        def written_now() -> dict[str, Any]:
            return dict(json.loads((state / "controller-state.json").read_text()))

        # The new leader stamps the format just after it takes the lead.
        wait_until(lambda: written_now()["document"].get("format") == 1, 10, "format 1 stored")
        written = written_now()
        assert {k: written["document"][k] for k in older} == older
        assert written["version"] == 5
    finally:
        moved.stop()
