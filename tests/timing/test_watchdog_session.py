"""A watched_calls session (one per F4 gate, one per comparison) keeps a timer that was
running before it (pytest-timeout's) on time between its calls, not only during them;
and every call of a comparison runs under the watchdog."""

from __future__ import annotations

import signal
import time
from collections.abc import Mapping
from types import FrameType

from pytest_arbiter.timing import watchdog
from pytest_arbiter.timing.measure import ComparePolicy, compare_latencies
from pytest_arbiter.timing.watchdog import watched_calls


def test_their_alarm_fires_at_its_time_between_the_calls_of_a_session(
        sigalrm_restored: None) -> None:
    fired: list[float] = []

    def theirs(signum: int, frame: FrameType | None) -> None:
        fired.append(time.monotonic())

    signal.signal(signal.SIGALRM, theirs)
    start = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    with watched_calls(5.0) as run:
        assert run(int, 7) == 7
        while not fired and time.monotonic() < start + 3.0:
            time.sleep(0.01)  # the gate's own work between two kernel calls
        assert fired, "their alarm waited for the session's end"
        assert run(int, 8) == 8
    time.sleep(0.05)
    assert len(fired) == 1 and fired[0] - start < 1.5
    assert signal.getsignal(signal.SIGALRM) is theirs
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0


def test_every_call_of_a_comparison_runs_under_its_deadline(sigalrm_restored: None) -> None:
    """The timed rounds arm no timer per call, but each call, warmup and rounds alike,
    runs with its own deadline set (and none is left set between the calls)."""
    limits: list[float | None] = []
    between: list[float | None] = []

    def kernel() -> None:
        limits.append(watchdog._watch.limit)

    def on_round(times: Mapping[str, float]) -> bool:
        between.append(watchdog._watch.limit)
        return False

    policy = ComparePolicy(warmup=2, min_rounds=5, max_rounds=5, call_timeout_s=5.0)
    comp = compare_latencies({"a": kernel, "b": kernel}, policy=policy, on_round=on_round)
    assert comp.rounds == 5
    # a round preempted on a loaded machine is timed again: more calls, same rule
    assert set(limits) == {5.0} and len(limits) >= 2 * 2 + 5 * 2
    assert set(between) == {None} and len(between) >= 5
