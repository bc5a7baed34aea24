"""The `integration` marker follows the rule of tests/conftest.py: the suite is collected in a
child pytest and the marked set is checked against modules and tests whose tier is known."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
ROOT = TESTS.parent

# Helpers of tests/ that, imported by a module, mean a test there starts Capstan in a process
# of its own (and the classes, which their own modules name without importing them).
CLASSES = {"BrokerProcess", "ControllerProcess", "UpProcess"}
PROCESS_NAMES = CLASSES | {"start_cluster", "capstan"}

EVERY_TEST_STARTS_PROCESSES = [
    "tests/broker/test_official_client.py",
    "tests/broker/replication/test_faults.py",
    "tests/cli/test_up.py",
    "tests/cli/test_cli_reaches.py",
    "tests/client/test_push_consumer.py",
    "tests/client/test_rebalance.py",
    # The real Kubernetes control plane's processes.
    "tests/kube/test_control_plane.py",
]
NO_TEST_STARTS_PROCESSES = [
    # Each crashes a child that writes the store on disk; no socket, so the fast tier.
    "tests/store/test_crash.py",
    "tests/store/test_faults.py",
    "tests/store/test_recovery.py",
    # The CLI on a store directory, and writers racing on a state file in processes.
    "tests/cli/test_store_commands.py",
    # A Kubernetes API emulator in a thread of the test process.
    "tests/kube/test_api_server.py",
    "tests/broker/replication/test_epoch_file.py",
    "tests/client/test_allocation.py",
]
# Modules that mix pure decisions with real processes: (a pure test, a process test).
MIXED = {
    # Each contract test runs on a file, the API emulator and a real API server.
    "tests/controller/test_state_store.py": (
        "test_a_damaged_file_is_reported_not_guessed_over",
        "test_a_new_store_is_empty_and_a_write_is_read_back_by_every_client",
    ),
    "tests/controller/test_admin_front.py": (
        "test_a_change_is_ok_only_when_every_group_made_it",
        "test_a_group_that_cannot_be_reached_is_named_and_the_others_keep_the_change",
    ),
    "tests/broker/replication/test_handover.py": (
        "test_a_slave_outside_the_sync_state_set_is_never_the_successor",
        "test_a_master_stopped_with_sigterm_hands_over_to_its_slave_which_takes_writes",
    ),
    "tests/client/test_producer.py": (
        "test_retries_leave_out_failed_broker_groups_until_none_is_left",
        "test_sends_move_to_another_broker_group_when_one_dies",
    ),
}


# Collects the whole suite once and prints, per test, its module, name and whether it is
# marked integration.
COLLECT = """
import json, sys, pytest
class Tiers:
    def pytest_collection_finish(self, session):
        rows = [(i.nodeid.split("::")[0], i.originalname if hasattr(i, "originalname") else i.name,
                 i.get_closest_marker("integration") is not None) for i in session.items]
        print("TIERS " + json.dumps(rows))
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
                      "tests"], plugins=[Tiers()]))
"""


@pytest.fixture(scope="module")
def tiers() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(every test, the integration tests), per module."""
    done = subprocess.run(
        [sys.executable, "-c", COLLECT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONSAFEPATH": "1"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("TIERS "))
    every: dict[str, set[str]] = {}
    integration: dict[str, set[str]] = {}
    for module, test, marked in json.loads(line.removeprefix("TIERS ")):
        every.setdefault(module, set()).add(test)
        if marked:
            integration.setdefault(module, set()).add(test)
    return every, integration


def helpers_named_in(module: str) -> set[str]:
    """The names a module imports from tests/ and the process classes it names."""
    tree = ast.parse((ROOT / module).read_text())
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} & CLASSES
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            names |= {alias.name for alias in node.names}
    return names


def test_modules_that_start_processes_in_every_test_are_wholly_integration(tiers):
    every, integration = tiers
    for module in EVERY_TEST_STARTS_PROCESSES:
        assert every[module] and integration.get(module) == every[module], module


def test_modules_with_no_capstan_process_have_no_integration_test(tiers):
    every, integration = tiers
    for module in NO_TEST_STARTS_PROCESSES:
        assert every[module] and module not in integration, module
    pure = [
        m for m in every if m.startswith("tests/store/") or m == "tests/kube/test_api_server.py"
    ]
    assert pure and not set(pure) & set(integration)


def test_in_a_mixed_module_only_the_tests_with_processes_are_integration(tiers):
    every, integration = tiers
    for module, (pure, with_processes) in MIXED.items():
        assert {pure, with_processes} <= every[module], module
        assert with_processes in integration[module] and pure not in integration[module]


def test_every_module_naming_a_process_tool_has_integration_tests(tiers):
    every, integration = tiers
    naming = [
        m for m in every if m != "tests/test_tiers.py" and PROCESS_NAMES & helpers_named_in(m)
    ]
    assert len(naming) > 20
    assert [m for m in naming if m not in integration] == []
