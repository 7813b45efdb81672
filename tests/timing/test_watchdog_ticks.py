"""The watchdog of a comparison sets the timer once, not twice per call, and still cuts
a hanging call short at its own limit."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest

from pytest_arbiter.errors import CallTimeout
from pytest_arbiter.timing import watchdog as watchdog_module
from pytest_arbiter.timing.measure import ComparePolicy, compare_latencies
from pytest_arbiter.timing.watchdog import watched_calls

needs_signal = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="no SIGALRM")


@pytest.fixture
def setitimer_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    calls: list[float] = []
    real = signal.setitimer

    def counting(which: int, seconds: float, interval: float = 0.0) -> tuple[float, float]:
        calls.append(seconds)
        return real(which, seconds, interval)

    monkeypatch.setattr(watchdog_module.signal, "setitimer", counting)
    yield calls
    real(signal.ITIMER_REAL, 0)


@needs_signal
def test_a_comparison_of_many_calls_sets_the_timer_a_few_times(
        setitimer_calls: list[float]) -> None:
    ran = {"n": 0}

    def a() -> None:
        ran["n"] += 1

    def b() -> None:
        ran["n"] += 1

    compare_latencies({"a": a, "b": b},
                      policy=ComparePolicy(call_timeout_s=60.0, min_rounds=20, max_rounds=20,
                                           budget_s=10.0))
    assert ran["n"] >= 40
    # paused and resumed around the session, the timer set once for the first call, and
    # stopped at the end: no call per timed call
    assert len(setitimer_calls) <= 4, setitimer_calls
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@needs_signal
@pytest.mark.timing
def test_a_call_after_a_long_quiet_one_is_still_cut_at_its_own_limit() -> None:
    """The timer set for the first call fires before the second call's deadline; the
    handler sets it again for that deadline, so the hang is cut at its limit, not
    earlier and not a whole limit later."""
    with watched_calls(0.3) as watched:
        watched(time.sleep, 0.2)  # the timer now fires 0.1 s into the next call
        start = time.monotonic()
        with pytest.raises(CallTimeout):
            watched(time.sleep, 5)
        took = time.monotonic() - start
    assert 0.25 <= took < 2.0, took
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def their_alarm_in_a_session(after_s: float, cut: bool) -> list[float]:
    """Their handler and alarm (``after_s`` from now), then a gate's session that cuts one
    call first if ``cut``; the times their alarm fired while the session was open."""
    from pytest_arbiter.timing.watchdog import watch_session, watchdog

    fired: list[float] = []
    signal.signal(signal.SIGALRM, lambda s, f: fired.append(time.monotonic() - start))
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, after_s)
    with watch_session(5.0):
        if cut:
            with pytest.raises(CallTimeout), watchdog(0.1):
                time.sleep(2)
        while time.monotonic() - start < after_s + 1.0 and not fired:
            time.sleep(0.01)
        return list(fired)


@needs_signal
@pytest.mark.timing
def test_their_alarm_fires_at_its_time_before_the_first_watched_call(
        sigalrm_restored: None) -> None:
    """pytest-timeout's alarm keeps its time while a gate's session is open: before the
    session's first call (the gate runs accepts() and the reference there)."""
    fired = their_alarm_in_a_session(0.2, cut=False)
    assert fired and fired[0] >= 0.19


@needs_signal
@pytest.mark.timing
def test_their_alarm_keeps_its_time_after_a_call_is_cut(sigalrm_restored: None) -> None:
    fired = their_alarm_in_a_session(0.5, cut=True)
    assert fired and fired[0] >= 0.45
