"""tests/conftest.py fails a test file that leaves a Capstan process running, naming it and
the test that started it, and does not blame a module's cluster whose processes a test
restarted and the module's teardown stopped.

Each case runs pytest on a small test file of its own, with tests/conftest.py as a plugin.
The process they start is a Python sleep whose command line names `capstan.cli`, which is
how the check recognises a Capstan process (a real broker would only make this slower)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STARTER = """
import subprocess, sys

def start():
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", "capstan.cli", "broker"]
    )
"""


def _run_pytest(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_case.py").write_text(STARTER + textwrap.dedent(body))
    # tests.conftest by its module name: the repo appended to the path, after the standard
    # library (its `operator/` folder would otherwise shadow the module of that name).
    run_pytest = (
        f"import sys; sys.path.append({str(REPO)!r}); import pytest; "
        f"sys.exit(pytest.main(['-q', '-p', 'tests.conftest', '-p', 'no:cacheprovider', "
        f"'--rootdir', {str(tmp_path)!r}, {str(tmp_path / 'test_case.py')!r}]))"
    )
    return subprocess.run(
        [sys.executable, "-c", run_pytest],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _alive(pid: int) -> bool:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_process_a_test_left_fails_the_file_naming_the_process_and_the_test(
    tmp_path: Path,
) -> None:
    result = _run_pytest(
        tmp_path,
        """
        PIDS = []

        def test_forgets_its_broker():
            PIDS.append(start().pid)
            print("PID", PIDS[0])

        def test_the_last_one():
            pass
        """,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "left running" in out, out
    assert "test_case.py::test_forgets_its_broker" in out, out
    assert "capstan.cli broker" in out, out
    assert "1 error" in out, out
    pid = int(out.split("started by")[0].rsplit("pid ", 1)[1].split()[0])
    assert not _alive(pid), f"the left process {pid} still runs"


def test_a_module_cluster_restarted_by_a_test_and_stopped_at_its_end_is_not_blamed(
    tmp_path: Path,
) -> None:
    result = _run_pytest(
        tmp_path,
        """
        import pytest

        class Cluster:
            def __init__(self):
                self.proc = start()

            def restart(self):
                self.proc.kill()
                self.proc.wait()
                self.proc = start()

            def stop(self):
                self.proc.kill()
                self.proc.wait()

        @pytest.fixture(scope="module")
        def cluster():
            c = Cluster()
            yield c
            c.stop()

        def test_restarts_a_broker(cluster):
            cluster.restart()

        def test_uses_it_again(cluster):
            assert cluster.proc.poll() is None
        """,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "2 passed" in out, out
