"""What the local node's offline image build (scripts/k8s_images.sh) relies on, checked
without a container engine: both Dockerfiles take their base as BASE, keep the public image as
its default and build every stage on it; a wheelhouse/ folder reaches the build context but
never the repository; the pod sandbox program exits 0 on SIGTERM and SIGINT. The build itself
runs against a dockerd, in the local node's end-to-end check."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "Dockerfile": "python:3.11-slim-bookworm",
    "spark/Dockerfile": "apache/spark:4.3.0-scala2.13-java17-python3-ubuntu",
}


def instructions(dockerfile: str) -> list[str]:
    joined = dockerfile.replace("\\\n", " ")
    return [line for line in joined.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("path", DOCKERFILES)
def test_every_stage_is_built_on_the_base_argument_whose_default_is_public(path: str) -> None:
    lines = instructions((REPO / path).read_text())
    first_from = next(i for i, line in enumerate(lines) if line.startswith("FROM "))
    assert f"ARG BASE={DOCKERFILES[path]}" in lines[:first_from]
    froms = [line for line in lines if line.startswith("FROM ")]
    assert len(froms) == 2
    assert all(re.fullmatch(r"FROM \$\{BASE\}( AS \w+)?", line) for line in froms), froms


@pytest.mark.parametrize("path", DOCKERFILES)
def test_capstan_lives_in_a_venv_first_on_path(path: str) -> None:
    text = (REPO / path).read_text()
    assert "python3 -m venv /opt/capstan" in text
    assert "COPY --from=build /opt/capstan /opt/capstan" in text
    assert "PATH=/opt/capstan/bin:$PATH" in text


def test_a_wheelhouse_reaches_the_build_context_but_not_the_repository() -> None:
    assert "!wheelhouse/" in (REPO / ".dockerignore").read_text().split()
    assert "wheelhouse/" in (REPO / ".gitignore").read_text().split()


@pytest.fixture(scope="module")
def pause(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The test command installs gcc first (scripts/k8s_node.sh prepare): no skip.
    assert shutil.which("gcc") is not None, "gcc is missing: run scripts/k8s_node.sh prepare"
    binary = tmp_path_factory.mktemp("pause") / "pause"
    source = REPO / "scripts" / "pause" / "pause.c"
    built = subprocess.run(
        ["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(source)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert built.returncode == 0, built.stderr
    return binary


@pytest.mark.parametrize("signo", [signal.SIGTERM, signal.SIGINT])
def test_the_pause_program_sleeps_until_told_to_stop_then_exits_0(
    pause: Path, signo: signal.Signals
) -> None:
    process = subprocess.Popen([str(pause)], stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.2)
        assert process.poll() is None
        process.send_signal(signo)
        assert process.wait(timeout=5) == 0
    finally:
        process.kill()
        process.wait()
