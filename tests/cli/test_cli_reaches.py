"""What a command says when `--server` is the wrong kind of service, or nothing at all:
real controller and broker processes, the real CLI."""

from __future__ import annotations

import time

import pytest

from tests.broker.broker_process import free_port
from tests.cli.test_broker_cli import capstan

# A wrong address is told within a second or two of the CLI's own start (giving up on a
# metrics port used to take 10 s more). The start - interpreter and imports - is measured
# beside each call, as a command that fails before it dials: CI runs the e2e story beside
# these tests, and there the start alone took several seconds and varied by seconds from
# one call to the next (4.3 s beyond it once, session 37).
PROMPT_S = 6.0


def _start_s() -> float:
    started = time.monotonic()
    done = capstan("group", "list", "--server", "localhost")
    assert done.returncode == 1 and "expected HOST:PORT" in done.stderr, done.stderr
    return time.monotonic() - started


def timed(*args: str) -> tuple[float, str, int]:
    """How long the command took beyond the CLI's start, what it wrote to stderr, its code."""
    start_s = _start_s()
    started = time.monotonic()
    done = capstan(*args)
    return time.monotonic() - started - start_s, done.stderr, done.returncode


def test_cluster_status_at_a_broker_names_the_broker_and_the_controller(broker):
    took, err, code = timed("cluster", "status", "--server", broker.address)
    assert code == 1 and took < PROMPT_S, err
    assert err.strip() == (
        f"error: {broker.address} is a Capstan broker; 'cluster status' needs the controller "
        "(capstan controller, default 127.0.0.1:9876)"
    )


@pytest.mark.parametrize(
    "args",
    [["topic", "list"], ["produce", "T", "--body", "x"], ["cluster", "status"]],
    ids=["topic-list", "produce", "cluster-status"],
)
def test_a_metrics_port_is_named_within_seconds(broker, args):
    server = f"127.0.0.1:{broker.http_port}"
    took, err, code = timed(*args, "--server", server)
    assert code == 1 and took < PROMPT_S, err
    assert f"{server} answers HTTP/1.0 (a metrics port?), not gRPC" in err
    assert "Traceback" not in err


def test_an_address_where_nothing_listens_fails_after_a_short_wait():
    server = f"127.0.0.1:{free_port()}"
    took, err, code = timed("topic", "list", "--server", server)
    assert code == 1 and took < 3.0 + PROMPT_S, err
    assert f"cannot reach {server} (connection refused)" in err


def test_a_malformed_address_is_one_line():
    done = capstan("group", "list", "--server", "localhost")
    assert done.returncode == 1 and done.stderr.strip() == (
        "error: --server 'localhost': expected HOST:PORT, e.g. 127.0.0.1:9876"
    )


def test_help_names_the_default_and_that_a_broker_works():
    for command in (["topic", "create"], ["produce"], ["consume"], ["message", "get"]):
        shown = " ".join(capstan(*command, "--help").stdout.split())
        assert "(default 127.0.0.1:9876, the controller `capstan up` starts)" in shown
        assert "or a broker" in shown or "or one broker" in shown, shown


def test_produce_and_consume_through_the_controller_without_groups_say_so(controller):
    done = capstan("produce", "T", "--body", "x", "--server", controller.address)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "error: route of topic T: INTERNAL_SERVER_ERROR: no broker group answered: "
        "none is registered or alive"
    )
