"""The image's command without a container engine: Capstan built as a wheel the way the
Dockerfile builds it, installed alone in a fresh virtual environment, run as the image runs
it (its ENTRYPOINT and CMD, its ENV, from an empty working directory): the default command
prints the usage, and `capstan broker` as the operator's pods run it serves."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.broker.broker_process import free_port
from tests.charts.helm import REPO
from tests.tiers import process_tool
from tests.waiting import run_progressing, wait_until

# Builds a wheel and installs it as the Dockerfile does: 135 s was seen in CI beside the
# e2e story's cold image builds, near the default per-test bound of 300 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def final_stage(dockerfile: str) -> dict[str, object]:
    """ENV, ENTRYPOINT and CMD of the Dockerfile's last stage."""
    lines = dockerfile.replace("\\\n", " ").splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("FROM "))
    env: dict[str, str] = {}
    found: dict[str, object] = {"env": env}
    for line in lines[start:]:
        word, _, rest = line.partition(" ")
        if word == "ENV":
            env.update(dict(part.split("=", 1) for part in shlex.split(rest)))
        elif word in ("ENTRYPOINT", "CMD"):
            found[word.lower()] = json.loads(rest)
    return found


def sh(
    *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_progressing(argv, cwd=cwd, env=env)


def test_the_images_command_runs_from_a_wheel_built_as_the_dockerfile_builds_it(
    tmp_path: Path,
) -> None:
    stage = final_stage((REPO / "Dockerfile").read_text())
    assert stage["entrypoint"] == ["capstan"]
    wheels, venv, workdir = tmp_path / "wheels", tmp_path / "venv", tmp_path / "work"
    workdir.mkdir()
    pip = (sys.executable, "-m", "pip")
    built = sh(*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO))
    assert built.returncode == 0, built.stderr
    assert sh(sys.executable, "-m", "venv", str(venv)).returncode == 0
    (wheel,) = wheels.glob("capstan-*.whl")
    installed = sh(str(venv / "bin" / "pip"), "install", "-q", str(wheel))
    assert installed.returncode == 0, installed.stderr
    image_env = stage["env"]
    assert isinstance(image_env, dict)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", **image_env}
    entrypoint = [str(venv / "bin" / "capstan")]
    cmd = stage["cmd"]
    assert isinstance(cmd, list)

    default = sh(*entrypoint, *cmd, cwd=workdir, env=env)
    assert default.returncode == 0, default.stderr
    assert "usage: capstan" in default.stdout and "operator" in default.stdout
    for command in ("broker", "controller", "operator"):
        helped = sh(*entrypoint, command, "--help", cwd=workdir, env=env)
        assert helped.returncode == 0, (command, helped.stderr)

    # A broker as a BrokerGroup's pod runs it: its config file and --set overrides.
    serves_a_broker(entrypoint, env, tmp_path, workdir)


@process_tool
def serves_a_broker(
    entrypoint: list[str], env: dict[str, str], tmp_path: Path, workdir: Path
) -> None:
    """`capstan broker` from the image's command serves until SIGTERM, then exits 0."""
    config = tmp_path / "broker.yaml"
    config.write_text(yaml.safe_dump({"broker_name": "g", "auto_create_topic": True}))
    grpc_port, http_port = free_port(), free_port()
    broker = subprocess.Popen(
        [
            *entrypoint,
            "broker",
            *("--config", str(config)),
            *("--set", f"data_dir={tmp_path / 'data'}", "--set", "listen_host=127.0.0.1"),
            *("--set", f"grpc_port={grpc_port}", "--set", f"http_port={http_port}"),
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def serving() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        wait_until(serving, 60, "the broker from the wheel to be ready")
    finally:
        broker.terminate()
        _, err = broker.communicate(timeout=30)
    assert broker.returncode == 0, err.decode()[-2000:]
