"""When `capstan up` restarts a child that died, and when it gives up on one (a pure
decision over the child's history, tested on its own).

A child that ran for a while before it died is restarted after `FIRST_DELAY_S`. One that
dies again within `QUICK_EXIT_S` of its start is crash-looping (a port taken, a store
locked, a broken disk): each such exit doubles the delay, and after `GIVE_UP_AFTER` of them
in a row it is left dead, so a child that cannot start does not flood its log forever.
"""

from __future__ import annotations

from dataclasses import dataclass

QUICK_EXIT_S = 10.0
FIRST_DELAY_S = 1.0
GIVE_UP_AFTER = 3


@dataclass(frozen=True)
class RestartHistory:
    restarts: int = 0
    """Restarts so far, since `capstan up` started."""

    quick_exits: int = 0
    """Exits in a row that came within QUICK_EXIT_S of a start."""


@dataclass(frozen=True)
class Restart:
    history: RestartHistory
    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    history: RestartHistory


def after_exit(history: RestartHistory, ran_s: float) -> Restart | GiveUp:
    """What to do about a child that exited after running `ran_s` seconds."""
    quick = history.quick_exits + 1 if ran_s < QUICK_EXIT_S else 0
    if quick >= GIVE_UP_AFTER:
        return GiveUp(RestartHistory(history.restarts, quick))
    return Restart(RestartHistory(history.restarts + 1, quick), FIRST_DELAY_S * 2**quick)
