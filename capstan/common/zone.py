"""A broker's zone (rack): the value of its node's topology label, such as
`topology.kubernetes.io/zone`, that the broker reports to the controller.

A zone is a Kubernetes label value: at most 63 characters, letters, digits, `-`, `_` and
`.`, beginning and ending with a letter or digit, or empty (unknown).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger(__name__)

MAX_LENGTH = 63
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def zone_problem(zone: str) -> str | None:
    """Why `zone` is no zone, or None when it is one ("" included)."""
    if len(zone) > MAX_LENGTH:
        return f"a zone has at most {MAX_LENGTH} characters, not {len(zone)}"
    if not _LABEL_VALUE.fullmatch(zone):
        return (
            f"zone {zone!r} is not a label value (letters, digits, '-', '_' and '.', "
            "beginning and ending with a letter or digit)"
        )
    return None


def read_zone_file(path: str) -> tuple[str, str | None]:
    """(the zone the file holds, why it holds none). A missing or empty file is an unknown
    zone, not a problem: the operator fills it once the pod's node is known."""
    if not path:
        return "", None
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except FileNotFoundError:
        return "", None
    except OSError as exc:
        return "", f"cannot read the zone file {path}: {exc}"
    problem = zone_problem(text)
    return ("", f"{path}: {problem}") if problem else (text, None)


class ZoneReader:
    """A broker's zone as of now: the `zone` setting, else what `zone_file` holds (read
    again each time: the operator may fill it after the broker started). A bad file is
    reported once per distinct problem and counts as an unknown zone."""

    def __init__(self, zone: str, zone_file: str) -> None:
        self._zone = zone
        self._file = zone_file
        self.problem: str | None = None
        """Why the file gave no zone at the last read; None when it did or has none."""

    def current(self) -> str:
        if self._zone or not self._file:
            return self._zone
        zone, problem = read_zone_file(self._file)
        if problem and problem != self.problem:
            log.warning("no zone to report: %s", problem)
        self.problem = problem
        return zone
