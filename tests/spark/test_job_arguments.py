"""The Spark jobs name their cluster with --server, as every command does: a controller
is told from a standalone broker by whether it serves the Controller service."""

from __future__ import annotations

from pathlib import Path

import pytest

from capstan.controller.broker_liveness import BrokerLiveness
from capstan.controller.controller_service import ControllerService
from capstan.controller.replica_manager import ReplicaManager
from capstan.controller.state_store import FileStateStore
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


def test_the_names_before_server_still_work_and_one_is_required(capsys) -> None:
    assert _parsed("--controller", "c:9876") == ("c:9876", ())
    assert _parsed("--brokers", "a:1,b:2") == ("", ("a:1", "b:2"))
    with pytest.raises(SystemExit):
        _parsed()
    assert "give --server HOST:PORT" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _parsed("--server", "a:1", "--controller", "c:9876")
