"""`capstan produce` and `capstan consume` through the controller keep working right
after the master of the group is killed with -9: they follow the route to the slave,
which serves once the controller has elected it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.broker.replication.test_controlled_group import (
    GROUP,
    start_cluster,
    stop_cluster,
)
from tests.cli.test_broker_cli import capstan
from tests.waiting import wait_until

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


def test_produce_and_consume_through_the_controller_survive_a_master_kill9(tmp_path: Path):
    cluster = start_cluster(tmp_path)
    try:
        wait_until(lambda: cluster.settled(2), 20, "a master with its slave in sync")
        server = ("--server", cluster.controller.address)
        assert capstan("topic", "create", "F", "--queues", "2", *server).returncode == 0
        assert capstan("group", "create", "FG", *server).returncode == 0
        before = capstan("produce", "F", "--json", *server, stdin="b1\nb2\nb3\n")
        assert before.returncode == 0, before.stderr
        old_master, slave = cluster.master(), cluster.slave()

        old_master.kill9()
        started = time.monotonic()
        after = capstan("produce", "F", "--json", *server, stdin="a1\na2\n")
        assert after.returncode == 0, after.stderr
        assert time.monotonic() - started < 30
        # If it waited (a route still naming the dead master), it said so once; a route
        # the controller already gave without it sends to the new master at once.
        assert after.stderr.count("waiting: ") <= 1, after.stderr
        sent = json.loads(after.stdout)["messages"]
        assert [m["broker"] for m in sent] == [GROUP, GROUP]
        assert cluster.master() is slave  # the writes waited for the election

        got = capstan("consume", "F", "--group", "FG", "--count", "5", "--json", *server)
        assert got.returncode == 0, got.stderr
        bodies = sorted(m["body"] for m in json.loads(got.stdout)["messages"])
        assert bodies == ["a1", "a2", "b1", "b2", "b3"]
    finally:
        stop_cluster(cluster)
