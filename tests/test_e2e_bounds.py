"""The e2e story's bounds table (e2e/bounds.py): every bound names a step the story reports,
and a figure past its bound, or a bounded figure left out, is found."""

from __future__ import annotations

import re
from pathlib import Path

from e2e.bounds import BOUNDS, breaches

STORY = (Path(__file__).resolve().parents[1] / "e2e" / "test_story.py").read_text()


def test_every_bounded_step_is_one_the_story_reports() -> None:
    # Steps d1 and d3 are named through _fault(story, "<what>", ...) as "d. <what>".
    reported = set(re.findall(r'report\.step\(\s*"([^"]+)"', STORY))
    reported |= {f"d. {what}" for what in re.findall(r'_fault\(\s*story,\s*"([^"]+)"', STORY)}
    # Steps e1-e3 are named through _roll(story, "<what>", ...) as "e. <what>".
    reported |= {f"e. {what}" for what in re.findall(r'_roll\(\s*story,\s*"([^"]+)"', STORY)}
    assert reported, "no step names found in the story"
    unknown = sorted(set(BOUNDS) - reported)
    assert not unknown, f"bounds for steps the story does not report: {unknown}"


def test_a_figure_past_its_bound_or_missing_is_a_breach() -> None:
    step = "d. master pod deleted"
    ok = {"seconds": 1.0, "back_in_sync_s": 10.0, "longest_send_gap_s": 0.5}
    assert breaches(step, ok) == []
    slow = {**ok, "longest_send_gap_s": 7.5}
    assert breaches(step, slow) == ["longest_send_gap_s = 7.5, bound <= 5"]
    missing = {k: v for k, v in ok.items() if k != "back_in_sync_s"}
    assert breaches(step, missing) == ["back_in_sync_s not reported (bound <= 90)"]


def test_a_lower_bound_is_a_breach_below_it() -> None:
    step = "c3. a CapstanUser granted, revoked"
    assert breaches(step, {"granted_s": 3.0, "refused": 9}) == []
    assert breaches(step, {"granted_s": 3.0, "refused": 2}) == ["refused = 2, bound >= 3"]


def test_a_step_without_bounds_has_no_breach() -> None:
    assert breaches("c. clients inside and outside flowing", {"seconds": 999.0}) == []


def test_the_operator_docs_list_the_same_bounds() -> None:
    docs = (Path(__file__).resolve().parents[1] / "docs" / "operator.md").read_text()
    listed = set(re.findall(r"^\| (.+?) \| `(\w+)` \| ([≤≥]) ([\d.]+) \|$", docs, re.MULTILINE))
    kept = {
        (step, figure, "≤" if kind == "<=" else "≥", f"{bound:g}")
        for step, figures in BOUNDS.items()
        for figure, (kind, bound) in figures.items()
    }
    assert kept, "no bounds"
    assert listed == kept, (
        f"docs/operator.md lacks {sorted(kept - listed)}, has extra {sorted(listed - kept)}"
    )


def test_failed_sends_inside_an_outage_window_are_not_counted_outside_it() -> None:
    from e2e.traffic import History

    history = History()
    lines = "\n".join(
        f"S\t{at}\t{ok}\tb{at}\t{'-' if ok else 'UNAVAILABLE'}"
        for at, ok in [(1.0, 1), (2.0, 0), (10.0, 0), (11.5, 0), (20.0, 0), (21.0, 1)]
    )
    history.add_lines("p", lines)
    assert history.failed() == 4
    assert history.failed(outside=[(10.0, 12.0)]) == 2
    assert history.failed(outside=[(10.0, 12.0), (1.5, 2.5), (19.0, 20.0)]) == 0
