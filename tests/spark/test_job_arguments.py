"""The Spark jobs name their cluster with --server, as every command does: a controller
is told from a standalone broker by whether it serves the Controller service."""

from __future__ import annotations

from pathlib import Path

import pytest

from capstan.controller.broker_liveness import BrokerLiveness
from capstan.controller.controller_service import ControllerService
from capstan.controller.replica_manager import ReplicaManager
from capstan.controller.state_store import FileStateStore
from capstan.spark.capstan_source import NoLeader, ReadOptions, Replica, replicas
from capstan.spark.job_arguments import add_audit_arguments, parse_job_arguments, targets
from tests.broker.broker_process import BrokerProcess
from tests.controller.test_controller_service import Served


def _parsed(*argv: str) -> tuple[str, tuple[str, ...]]:
    return targets(parse_job_arguments("audit", None, add_audit_arguments, list(argv)))


def test_a_controller_and_standalone_brokers_are_told_apart(tmp_path: Path) -> None:
    manager = ReplicaManager(FileStateStore(tmp_path / "c"), BrokerLiveness(5.0), unclean=False)
    controller = Served(ControllerService(manager, "c0", lambda: True))
    (tmp_path / "b").mkdir()
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        at_controller = f"127.0.0.1:{controller.port}"
        assert _parsed("--server", at_controller) == (at_controller, ())
        assert _parsed("--server", broker.address) == ("", (broker.address,))
        two = f"{broker.address},127.0.0.1:1"
        assert _parsed("--server", two) == ("", (broker.address, "127.0.0.1:1"))
    finally:
        broker.stop()
        controller.close()


def test_controller_replicas_are_told_by_any_of_them_and_the_jobs_reach_the_leader(
    tmp_path: Path,
) -> None:
    """Several controller replicas (as the operator schedules jobs with): a follower refuses
    the call but names the service; the job's reads then find the leader among them. An
    address nobody answers at is passed over when telling brokers apart."""
    store = FileStateStore(tmp_path / "c")
    follower = Served(
        ControllerService(ReplicaManager(store, BrokerLiveness(5.0), False), "c1", lambda: False)
    )
    leader = Served(
        ControllerService(ReplicaManager(store, BrokerLiveness(5.0), False), "c0", lambda: True)
    )
    (tmp_path / "b").mkdir()
    broker = BrokerProcess(tmp_path / "b").start()
    try:
        at_follower, at_leader = f"127.0.0.1:{follower.port}", f"127.0.0.1:{leader.port}"
        both = f"{at_follower},{at_leader}"
        assert _parsed("--server", both) == (both, ())
        assert _parsed("--server", f"127.0.0.1:1,{both}") == (f"127.0.0.1:1,{both}", ())
        dead_first = f"127.0.0.1:1,{broker.address}"
        assert _parsed("--server", dead_first) == ("", ("127.0.0.1:1", broker.address))

        def read_from(controller: str) -> list[Replica]:
            return replicas(ReadOptions("-", controller, (), True, 1, {}, 30.0))

        assert read_from(both) == []  # answered by the leader: no group registered yet
        with pytest.raises(NoLeader, match=f"no controller leads at {at_follower}"):
            read_from(at_follower)
    finally:
        broker.stop()
        follower.close()
        leader.close()


def test_the_names_before_server_still_work_and_one_is_required(capsys) -> None:
    assert _parsed("--controller", "c:9876") == ("c:9876", ())
    assert _parsed("--brokers", "a:1,b:2") == ("", ("a:1", "b:2"))
    with pytest.raises(SystemExit):
        _parsed()
    assert "give --server HOST:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parsed("--server", "a:1", "--controller", "c:9876")
