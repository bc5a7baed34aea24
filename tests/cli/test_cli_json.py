"""`--json` in one style: every command prints exactly one JSON object with snake_case
keys, through a real controller and a master + slave group."""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.broker.replication.test_controlled_group import (
    GROUP,
    Cluster,
    start_cluster,
    stop_cluster,
)
from tests.cli.test_broker_cli import capstan
from tests.store.conftest import make_message, open_store
from tests.waiting import wait_until

SNAKE_CASE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
# Maps whose keys are the user's (message properties, topic attributes), not the CLI's.
USER_KEYED = frozenset({"properties", "attributes"})


def non_snake_keys(value: Any, path: str = "") -> list[str]:
    if isinstance(value, list):
        return [k for i, item in enumerate(value) for k in non_snake_keys(item, f"{path}[{i}]")]
    if not isinstance(value, dict):
        return []
    found = []
    for key, item in value.items():
        if not SNAKE_CASE.fullmatch(key):
            found.append(f"{path}.{key}")
        if key not in USER_KEYED:
            found.extend(non_snake_keys(item, f"{path}.{key}"))
    return found


def one_object(*args: str, stdin: str | None = None) -> dict[str, Any]:
    done = capstan(*args, "--json", stdin=stdin)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)  # several objects or lines would not parse
    assert isinstance(document, dict), done.stdout
    assert non_snake_keys(document) == [], done.stdout
    return document


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("json"))
    try:
        wait_until(lambda: c.settled(2), 20, "a master with its slave in sync")
        yield c
    finally:
        stop_cluster(c)


def test_every_command_prints_one_snake_case_object(cluster: Cluster, tmp_path: Path):
    server = ("--server", cluster.controller.address)
    made = one_object("topic", "create", "J", "--queues", "2", *server)
    assert made["topic"]["write_queue_nums"] == 2
    one_object("topic", "update", "J", "--queues", "3", *server)
    assert len(one_object("topic", "describe", "J", *server)["queues"]) == 3
    assert "J" in [t["name"] for t in one_object("topic", "list", *server)["topics"]]
    one_object("group", "create", "JG", *server)
    one_object("group", "update", "JG", "--max-attempts", "3", *server)

    sent = one_object("produce", "J", "--key", "k1", *server, stdin="a\nb\nc\n")["messages"]
    assert len(sent) == 3
    assert {m["broker"] for m in sent} == {GROUP}
    assert all(m["queue_id"] in range(3) and m["queue_offset"] >= 0 for m in sent)
    got = one_object("consume", "J", "--group", "JG", "--count", "3", *server)
    assert sorted(m["body"] for m in got["messages"]) == ["a", "b", "c"]
    assert {(m["message_id"], m["queue_id"], m["queue_offset"]) for m in got["messages"]} == {
        (m["message_id"], m["queue_id"], m["queue_offset"]) for m in sent
    }
    found = one_object("message", "get", "--topic", "J", "--key", "k1", *server)
    assert sorted(m["body"] for m in found["messages"]) == ["a", "b", "c"]

    assert one_object("group", "describe", "JG", *server)["total_lag"] == 0
    assert "JG" in [g["name"] for g in one_object("group", "list", *server)["groups"]]
    reset = one_object("group", "reset-offset", "JG", "--topic", "J", "--earliest", *server)[
        "offsets"
    ]
    assert sum(o["lag"] for o in reset) == 3 and {o["broker"] for o in reset} == {GROUP}

    status = one_object("cluster", "status", *server)
    (group,) = status["groups"]
    slave = next(r["id"] for r in group["replicas"] if r["role"] == "slave")
    switched = one_object("cluster", "elect-master", GROUP, "--broker-id", str(slave), *server)
    assert switched["changed"] is True and switched["group"]["master"] == slave

    assert one_object("group", "delete", "JG", *server) == {"group": "JG", "deleted": True}
    assert one_object("topic", "delete", "J", *server) == {"topic": "J", "deleted": True}

    with open_store(tmp_path) as store:
        store.put([make_message(i) for i in range(2)])
    assert one_object("store", "check", "--data-dir", str(tmp_path))["crashed"] is False
    queues = one_object("store", "queues", "--data-dir", str(tmp_path))["queues"]
    assert queues == [{"topic": "Orders", "queue_id": 0, "min_offset": 0, "max_offset": 2}]


def test_produce_sends_a_keyed_message_of_a_compact_topic_to_its_keys_queue(cluster: Cluster):
    # Through the controller, whose route passes on that the topic routes by key.
    server = ("--server", cluster.controller.address)
    compact = ("--attribute", "cleanup.policy=COMPACT")
    made = capstan("topic", "create", "Latest", "--queues", "4", *compact, *server)
    assert made.returncode == 0, made.stderr
    queues: dict[str, set[int]] = {}
    for run in range(2):  # each run starts its round robin afresh: keys must not care
        for key in ("user-1", "user-2", "user-3"):
            two = ("--count", "2", "--body", f"v{run}")
            sent = capstan("produce", "Latest", "--key", key, *two, "--json", *server)
            assert sent.returncode == 0, sent.stderr
            queues.setdefault(key, set()).update(
                m["queue_id"] for m in json.loads(sent.stdout)["messages"]
            )
    assert queues == {k: {zlib.crc32(k.encode()) % 4} for k in queues}


def test_produce_and_consume_show_the_group_queue_and_offset(cluster: Cluster):
    server = ("--server", cluster.controller.address)
    assert capstan("topic", "create", "H", "--queues", "1", *server).returncode == 0
    assert capstan("group", "create", "HG", *server).returncode == 0
    first = capstan("produce", "H", "--body", "x", "--count", "2", *server)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        f"to queue 0 at offset 0 ({GROUP})",
        f"to queue 0 at offset 1 ({GROUP})",
    ]
    got = capstan("consume", "H", "--group", "HG", "--count", "2", *server)
    assert [line.split(" ", 1)[1] for line in got.stdout.splitlines()] == [
        f"{GROUP} queue 0@0 attempt 1: x",
        f"{GROUP} queue 0@1 attempt 1: x",
    ]
