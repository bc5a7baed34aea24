"""The CLI against a real broker: the spellings scripts rely on, --json, and clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.broker.broker_process import BrokerProcess, free_port, free_port_run
from tests.tiers import process_tool


@process_tool
def capstan(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own; `env` replaces the environment it inherits."""
    env = {**(os.environ if env is None else env), "PYTHONSAFEPATH": "1"}
    return subprocess.run(
        [sys.executable, "-m", "capstan.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    process = BrokerProcess(tmp_path_factory.mktemp("cli")).start()
    yield ["--server", process.address]
    process.stop()


def test_topic_lifecycle(server):
    made = capstan("topic", "create", "Cli", "--type", "FIFO", "--queues", "3", *server, "--json")
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["topic"]["type"] == "FIFO"
    again = capstan("topic", "create", "Cli", *server)
    assert again.returncode == 1 and "already exists" in again.stderr
    listed = json.loads(capstan("topic", "list", "--json", *server).stdout)["topics"]
    assert {
        "name": "Cli",
        "broker": "broker-a",
        "type": "FIFO",
        "read_queues": 3,
        "write_queues": 3,
        "perm": 6,
        "messages": 0,
    } in listed
    assert all(not t["name"].startswith(("SCHEDULE", "RMQ_SYS")) for t in listed)
    upd = capstan("topic", "update", "Cli", "--queues", "5", "--json", *server)
    assert json.loads(upd.stdout)["topic"]["write_queue_nums"] == 5
    described = json.loads(capstan("topic", "describe", "Cli", "--json", *server).stdout)
    assert len(described["queues"]) == 5
    assert capstan("topic", "delete", "Cli", *server).returncode == 0
    gone = capstan("topic", "describe", "Cli", *server)
    assert gone.returncode == 1 and "not found" in gone.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["topic", "create", "bad name!"], "may contain only"),
        (["topic", "create", "X", "--queues", "0"], "at least 1"),
        (["topic", "create", "X", "--queues", "5000"], "queue counts"),
        (["topic", "create", "SCHEDULE_TOPIC_XXXX"], "reserves"),
        (["group", "create", "G!"], "may contain only"),
        (["group", "create", "Gx", "--max-attempts", "99"], "max_attempts"),
    ],
)
def test_bad_admin_input_is_a_clear_error(server, args, message):
    result = capstan(*args, *server)
    assert result.returncode == 1 and message in result.stderr, result.stderr


def test_produce_consume_group_and_message_lookup(server):
    assert (
        capstan("topic", "create", "Flow", "--type", "NORMAL", "--queues", "2", *server).returncode
        == 0
    )
    assert capstan("group", "create", "Readers", "--max-attempts", "4", *server).returncode == 0
    sent = capstan(
        "produce",
        "Flow",
        "--tag",
        "T1",
        "--key",
        "order-7",
        "--json",
        *server,
        stdin="first\nsecond\nthird\n",
    )
    assert sent.returncode == 0, sent.stderr
    ids = [m["message_id"] for m in json.loads(sent.stdout)["messages"]]
    assert len(ids) == 3
    got = capstan("consume", "Flow", "--group", "Readers", "--count", "3", "--json", *server)
    rows = json.loads(got.stdout)["messages"]
    assert sorted(r["body"] for r in rows) == ["first", "second", "third"]
    assert {r["message_id"] for r in rows} == set(ids) and {r["tag"] for r in rows} == {"T1"}
    desc = json.loads(capstan("group", "describe", "Readers", "--json", *server).stdout)
    assert desc["group"]["max_attempts"] == 4 and desc["total_lag"] == 0
    groups = json.loads(capstan("group", "list", "--json", *server).stdout)["groups"]
    assert {
        "name": "Readers",
        "broker": "broker-a",
        "fifo": False,
        "max_attempts": 4,
        "total_lag": 0,
        "clients": 0,
    } in groups
    by_id = json.loads(
        capstan("message", "get", "--topic", "Flow", "--id", ids[1], "--json", *server).stdout
    )
    assert [m["body"] for m in by_id["messages"]] == ["second"]
    by_key = json.loads(
        capstan("message", "get", "--topic", "Flow", "--key", "order-7", "--json", *server).stdout
    )
    assert sorted(m["body"] for m in by_key["messages"]) == ["first", "second", "third"]
    missing = capstan("message", "get", "--topic", "Flow", "--key", "nope", *server)
    assert missing.returncode == 1 and "no such message" in missing.stderr
    reset = capstan(
        "group", "reset-offset", "Readers", "--topic", "Flow", "--earliest", "--json", *server
    )
    assert sum(o["lag"] for o in json.loads(reset.stdout)["offsets"]) == 3
    again = capstan("consume", "Flow", "--group", "Readers", "--count", "3", "--json", *server)
    assert len(json.loads(again.stdout)["messages"]) == 3


def test_unreachable_server_is_a_clear_error():
    result = capstan("topic", "list", "--server", f"127.0.0.1:{free_port()}")
    assert result.returncode == 1 and "cannot reach" in result.stderr


def test_capstan_up_runs_a_controller_and_a_replicated_group_until_sigterm(tmp_path: Path):
    port, controller_port = free_port_run(2), free_port()
    data = tmp_path / "d"
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "capstan.cli",
            "up",
            "--port",
            str(port),
            "--http-port",
            str(free_port_run(3)),
            "--controller-port",
            str(controller_port),
            "--data-dir",
            str(data),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    server = ("--server", f"127.0.0.1:{port}")
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not lines or "Stop with Ctrl-C" not in lines[-1]:
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        assert any("waiting for masters" in line for line in lines)  # progress is shown
        access_point = f"access point (RocketMQ 5 gRPC, every group) : 127.0.0.1:{controller_port}"
        assert any(access_point in x for x in lines)
        assert capstan("topic", "create", "Up", *server).returncode == 0
        assert capstan("produce", "Up", "--body", "hi", *server).returncode == 0
        status = capstan("cluster", "status", "--json", "--server", f"127.0.0.1:{controller_port}")
        (group,) = json.loads(status.stdout)["groups"]
        manifest = json.loads((data / "cluster.json").read_text())
        started = {p["address"]: p["pid"] for p in manifest["processes"]}
        assert {r["address"]: r["pid"] for r in group["replicas"]} == {
            a: pid for a, pid in started.items() if not a.endswith(f":{controller_port}")
        }
        assert sorted(r["role"] for r in group["replicas"]) == ["master", "slave"]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()
        assert code == 0
    for name in ("broker-a-1", "broker-a-2"):
        store = data / name / "store"
        assert (store / "commitlog").is_dir()
        check = capstan("store", "check", "--data-dir", str(store), "--json")
        assert check.returncode == 0 and json.loads(check.stdout)["crashed"] is False
