"""The CLI's reads on `capstan up --groups 2`: through the access point every list and describe
shows both broker groups' rows, each naming its group (the issue: `topic describe` showed one
group's queues, `group describe` both groups' offsets with nothing telling them apart);
through one broker's address, its own group's, named too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cli.test_broker_cli import capstan
from tests.cli.up_process import UpProcess

GROUPS = ["broker-a", "broker-b"]
SENT = 8


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpProcess]:
    process = UpProcess(tmp_path_factory.mktemp("up-groups"), replicas=1, groups=2).start()
    try:
        yield process
    finally:
        process.stop()


def run(up: UpProcess, *args: str, server: str | None = None) -> str:
    done = capstan(*args, "--server", server or up.access_point)
    assert done.returncode == 0, f"capstan {' '.join(args)}: {done.stderr}"
    return done.stdout


def run_json(up: UpProcess, *args: str, server: str | None = None) -> Any:
    return json.loads(run(up, *args, "--json", server=server))


@pytest.fixture(scope="module")
def sent(up: UpProcess) -> list[dict[str, Any]]:
    """Spread made on both groups, SENT messages on queues of both, all consumed by Readers."""
    run(up, "topic", "create", "Spread", "--queues", "2")
    run(up, "group", "create", "Readers")
    produced = run_json(up, "produce", "Spread", "--body", "b", "--key", "k", "--count", str(SENT))
    messages: list[dict[str, Any]] = produced["messages"]
    assert sorted({m["broker"] for m in messages}) == GROUPS, messages
    consumed = run_json(up, "consume", "Spread", "--group", "Readers", "--count", str(SENT))
    assert len(consumed["messages"]) == SENT
    return messages


def rows_naming(text: str, word: str) -> dict[str, list[str]]:
    """Each group's lines of `text` that hold `word`."""
    lines = [x for x in text.splitlines() if word in x.split()]
    return {g: [x for x in lines if g in x.split()] for g in GROUPS}


def test_topic_describe_shows_every_groups_queues_each_named(up, sent):
    topic = run_json(up, "topic", "describe", "Spread")
    assert topic["brokers"] == GROUPS
    queues = [(q["broker"], q["queue_id"]) for q in topic["queues"]]
    assert queues == [(g, q) for g in GROUPS for q in (0, 1)]
    assert sum(q["max_offset"] for q in topic["queues"]) == SENT
    text = run(up, "topic", "describe", "Spread")
    assert "topic Spread on broker-a, broker-b:" in text
    by_group = {g: [x.split() for x in text.splitlines() if x.split()[:1] == [g]] for g in GROUPS}
    assert all([row[1] for row in by_group[g]] == ["0", "1"] for g in GROUPS), text


def test_group_describe_names_the_group_of_every_offset(up, sent):
    group = run_json(up, "group", "describe", "Readers")
    assert group["brokers"] == GROUPS
    spread = {(o["broker"], o["queue_id"]) for o in group["offsets"] if o["topic"] == "Spread"}
    assert spread == {(g, q) for g in GROUPS for q in (0, 1)}
    assert group["total_lag"] == 0
    text = run(up, "group", "describe", "Readers")
    assert "group Readers on broker-a, broker-b:" in text
    rows = rows_naming(text, "Spread")
    assert all(len(rows[g]) == 2 for g in GROUPS), text


def test_topic_list_has_a_row_per_group(up, sent):
    rows = [r for r in run_json(up, "topic", "list")["topics"] if r["name"] == "Spread"]
    assert [r["broker"] for r in rows] == GROUPS
    assert sum(r["messages"] for r in rows) == SENT
    text = run(up, "topic", "list")
    assert text.splitlines()[0].split()[:2] == ["TOPIC", "BROKER"]
    assert all(len(lines) == 1 for lines in rows_naming(text, "Spread").values()), text


def test_group_list_has_a_row_per_group(up, sent):
    rows = [r for r in run_json(up, "group", "list")["groups"] if r["name"] == "Readers"]
    assert [r["broker"] for r in rows] == GROUPS
    text = run(up, "group", "list")
    assert text.splitlines()[0].split()[:2] == ["GROUP", "BROKER"]
    assert all(len(lines) == 1 for lines in rows_naming(text, "Readers").values()), text


def test_message_get_names_the_group_that_stores_it(up, sent):
    for m in (next(m for m in sent if m["broker"] == g) for g in GROUPS):
        found = run_json(up, "message", "get", "--topic", "Spread", "--id", m["message_id"])
        assert [(x["message_id"], x["broker"]) for x in found["messages"]] == [
            (m["message_id"], m["broker"])
        ]
        text = run(up, "message", "get", "--topic", "Spread", "--id", m["message_id"])
        assert text.split()[:2] == [m["message_id"], m["broker"]]
    by_key = run_json(up, "message", "get", "--topic", "Spread", "--key", "k")
    assert sorted({x["broker"] for x in by_key["messages"]}) == GROUPS


def test_one_brokers_address_shows_its_own_group_named(up, sent):
    (broker_b,) = [p["address"] for p in up.manifest()["processes"] if p["group"] == "broker-b"]
    topic = run_json(up, "topic", "describe", "Spread", server=broker_b)
    assert topic["brokers"] == ["broker-b"]
    assert {q["broker"] for q in topic["queues"]} == {"broker-b"}
    group = run_json(up, "group", "describe", "Readers", server=broker_b)
    assert {o["broker"] for o in group["offsets"]} == {"broker-b"}
    listed = run_json(up, "topic", "list", server=broker_b)["topics"]
    assert [r["broker"] for r in listed if r["name"] == "Spread"] == ["broker-b"]


def test_a_created_topic_shows_every_groups_queues(up):
    made = run_json(up, "topic", "create", "Made", "--queues", "1")
    assert made["brokers"] == GROUPS
    assert [q["broker"] for q in made["queues"]] == GROUPS


def test_a_static_topic_is_made_described_and_moved_from_the_cli(up):
    made = run_json(up, "topic", "create", "Ledgered", "--static", "--queues", "4")
    queues = made["queue_mapping"]["queues"]
    assert [q["items"][0]["group"] for q in queues] == GROUPS * 2
    assert sorted(made["brokers"]) == GROUPS
    produced = run_json(up, "produce", "Ledgered", "--body", "b", "--count", "8")
    assert sorted({m["broker"] for m in produced["messages"]}) == GROUPS
    run(up, "group", "create", "LedgerReaders")
    consumed = run_json(up, "consume", "Ledgered", "--group", "LedgerReaders", "--count", "8")
    assert len(consumed["messages"]) == 8
    moved = run_json(up, "topic", "remap", "Ledgered", "0", "broker-b")
    last = moved["queue_mapping"]["queues"][0]["items"][-1]
    assert (last["group"], last["end_offset"]) == ("broker-b", -1)
    text = run(up, "topic", "describe", "Ledgered")
    assert "static topic Ledgered: 4 logic queues, epoch 3" in text
    assert "read only" in text and "takes writes" in text
    described = run_json(up, "topic", "describe", "Ledgered")
    assert described["queue_mapping"]["epoch"] == 3
    wrong = capstan("topic", "create", "Loose", "--groups", "broker-a", "--server", up.access_point)
    assert wrong.returncode != 0 and "--groups is for a static topic" in wrong.stderr
