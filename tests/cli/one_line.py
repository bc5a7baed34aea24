"""What a command that cannot start must print: exactly one `error:` line naming the cause,
and nothing of the Python machinery behind it."""

from __future__ import annotations

import subprocess

NOISE = (
    "Traceback",
    "Event loop is closed",
    "never awaited",
    "Task was destroyed",
    "Exception ignored",
)


def the_error_line(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The only line `result` printed (stdout and stderr together), an `error:` line holding
    every fragment, after a non-zero exit."""
    output = (result.stdout or "") + (result.stderr or "")
    assert result.returncode != 0, output
    assert not any(noise in output for noise in NOISE), output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("error: "), output
    for fragment in fragments:
        assert fragment in lines[0], output
    return lines[0]
