"""SignalStop: what `capstan up` waits on for Ctrl-C, SIGTERM and SIGHUP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

WAITER = textwrap.dedent(
    """
    import signal, sys, time
    from capstan.common.signal_stop import SignalStop

    stop = SignalStop()
    stop.install([signal.SIGHUP, signal.SIGTERM])
    print("ready", flush=True)
    waits = 0
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        stop.wait(0.0001)
        waits += 1
    print("stopped" if stop.is_set() else "not-asked", waits, flush=True)
    """
)


def start_waiter(seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", WAITER, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_a_barrage_of_signals_during_waits_never_hangs_the_waiter() -> None:
    # `capstan up` once hung for good on one SIGHUP: its handler set a threading.Event while
    # the main thread held that event's lock inside wait(). Many signals, each one a chance
    # to land inside a wait, must each be taken and the waiter must still end on time.
    proc = start_waiter(3.0)
    try:
        for _ in range(5000):
            os.kill(proc.pid, signal.SIGHUP)
        out, _ = proc.communicate(timeout=30)
        assert out.split()[0] == "stopped"
        assert proc.returncode == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_signal_ends_a_long_wait_at_once() -> None:
    code = textwrap.dedent(
        """
        import signal, time
        from capstan.common.signal_stop import SignalStop

        stop = SignalStop()
        stop.install([signal.SIGTERM])
        print("ready", flush=True)
        t = time.monotonic()
        assert not stop.is_set()
        print(stop.wait(60), round(time.monotonic() - t, 3), flush=True)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
        answered, waited = out.split()
        assert answered == "True"
        assert float(waited) < 5
    finally:
        proc.kill()
        proc.wait()


def test_without_a_signal_wait_answers_false_after_its_timeout() -> None:
    proc = start_waiter(0.3)
    out, _ = proc.communicate(timeout=30)
    assert out.split()[0] == "not-asked"
    assert int(out.split()[1]) > 10
