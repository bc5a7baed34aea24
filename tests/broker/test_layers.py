"""The broker's import contracts (pyproject.toml) catch an import across its layers.

lint-imports runs on a tree of symlinks laid out as the `capstan` namespace, as
scripts/lint.sh does; the one module a case injects an import into is a copy, so the
checkout itself is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("broker", "controller", "operator", "client", "spark", "bench")
LAYERS = "Inside the broker: composition root -> protocol edge -> services -> store"
STUBS = "The official client's generated stubs are the protocol edge's alone"
HANDED = "The protocol edge is handed its services; it does not import the Broker"


def _link_children(source: Path, target: Path) -> None:
    target.mkdir()
    for entry in source.iterdir():
        (target / entry.name).symlink_to(entry)


def namespace_tree(root: Path, inject: tuple[str, str] | None = None) -> Path:
    """The `capstan` namespace under `root`; `inject` = (module path, line to append)."""
    _link_children(REPO / "capstan", root / "capstan")
    for package in PACKAGES:
        (root / "capstan" / package).symlink_to(REPO / package)
    if inject is not None:
        path, line = inject
        parts = Path(path).parts
        # Replace each symlinked folder on the way down with a folder of symlinks.
        for depth in range(2, len(parts)):
            folder = root.joinpath(*parts[:depth])
            real = folder.resolve()
            folder.unlink()
            _link_children(real, folder)
        module = root / path
        real = module.resolve()
        module.unlink()
        shutil.copyfile(real, module)
        with module.open("a") as f:
            f.write(f"\n{line}\n")
    return root


def lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}
    command = [str(Path(sys.executable).parent / "lint-imports"), "--no-cache"]
    return subprocess.run(
        [*command, "--config", str(REPO / "pyproject.toml")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_untouched_tree_keeps_every_contract(tmp_path: Path) -> None:
    result = lint_imports(namespace_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in result.stdout
    assert f"{STUBS} KEPT" in result.stdout
    assert f"{HANDED} KEPT" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract", "named"),
    [
        (
            "capstan/broker/store/format.py",
            "import capstan.broker.edge.v2.wire",
            LAYERS,
            "capstan.broker.store.format -> capstan.broker.edge.v2.wire",
        ),
        (
            "capstan/broker/pop/pop_state.py",
            "import capstan.broker.edge.forwarding",
            LAYERS,
            "capstan.broker.pop.pop_state -> capstan.broker.edge.forwarding",
        ),
        (
            "capstan/broker/transaction/transaction_service.py",
            "from rocketmq.grpc_protocol import definition_pb2",
            STUBS,
            "capstan.broker.transaction.transaction_service -> rocketmq",
        ),
        (
            "capstan/broker/edge/v2/send.py",
            "from capstan.broker.broker import Broker",
            HANDED,
            "capstan.broker.edge.v2.send -> capstan.broker.broker",
        ),
        (
            "capstan/broker/catalog.py",
            "import capstan.broker.write_path",
            LAYERS,
            "capstan.broker.catalog -> capstan.broker.write_path",
        ),
    ],
)
def test_an_import_across_the_layers_breaks_the_contract_naming_it(
    tmp_path: Path, module: str, line: str, contract: str, named: str
) -> None:
    result = lint_imports(namespace_tree(tmp_path, (module, line)))
    assert result.returncode != 0
    assert f"{contract} BROKEN" in result.stdout, result.stdout
    assert named in result.stdout, result.stdout
