"""When `capstan up` restarts a dead child, and when it gives up on it."""

from __future__ import annotations

from capstan.commands.restart_policy import (
    FIRST_DELAY_S,
    GIVE_UP_AFTER,
    QUICK_EXIT_S,
    GiveUp,
    Restart,
    RestartHistory,
    after_exit,
)

LONG_RUN_S = QUICK_EXIT_S * 100
QUICK_S = QUICK_EXIT_S / 10


def test_a_child_that_ran_a_while_is_restarted_after_the_first_delay():
    decision = after_exit(RestartHistory(), LONG_RUN_S)
    assert decision == Restart(RestartHistory(restarts=1, quick_exits=0), FIRST_DELAY_S)


def test_quick_exits_double_the_delay_then_give_up():
    history, delays = RestartHistory(), []
    decision: Restart | GiveUp = Restart(history, 0)
    while isinstance(decision, Restart):
        decision = after_exit(decision.history, QUICK_S)
        if isinstance(decision, Restart):
            delays.append(decision.delay_s)
    assert delays == [FIRST_DELAY_S * 2**n for n in range(1, GIVE_UP_AFTER)]
    assert decision.history.quick_exits == GIVE_UP_AFTER
    assert decision.history.restarts == GIVE_UP_AFTER - 1


def test_a_long_run_forgives_earlier_quick_exits():
    history = RestartHistory(restarts=5, quick_exits=GIVE_UP_AFTER - 1)
    decision = after_exit(history, LONG_RUN_S)
    assert decision == Restart(RestartHistory(restarts=6, quick_exits=0), FIRST_DELAY_S)


def test_the_restart_count_keeps_growing_across_long_runs():
    history = RestartHistory()
    for _ in range(10):
        decision = after_exit(history, LONG_RUN_S)
        assert isinstance(decision, Restart)
        history = decision.history
    assert history.restarts == 10
