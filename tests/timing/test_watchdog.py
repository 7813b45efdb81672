"""The watchdog that ends a hanging call (SIGALRM on the main thread): it cuts the call
short, restores or chains the handler it found, and stays out of other threads' way."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

import pytest

from pytest_arbiter.errors import CallTimeout
from pytest_arbiter.timing.measure import ComparePolicy, compare_latencies
from pytest_arbiter.timing.watchdog import watchdog, watchdog_available
from tests.factories import ScriptedTimer

needs_signal = pytest.mark.skipif(not watchdog_available(),
                                  reason="the SIGALRM watchdog cannot be used here "
                                         "(no setitimer, not the main thread, or another "
                                         "SIGALRM handler such as pytest-timeout's)")




@needs_signal
def test_the_watchdog_cuts_a_hanging_call_short(sigalrm_restored: None) -> None:
    start = time.perf_counter()
    with pytest.raises(CallTimeout) as info, watchdog(0.2):
        time.sleep(30)
    assert time.perf_counter() - start < 3.0
    assert info.value.seconds == 0.2
    assert str(info.value).startswith("no result after 0.2 s")
    assert not isinstance(info.value, Exception)  # a kernel's except Exception can't eat it
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@needs_signal
def test_a_hanging_candidate_fails_and_the_other_is_picked(sigalrm_restored: None) -> None:
    def hang() -> None:
        time.sleep(30)

    def fast() -> None:
        pass

    start = time.perf_counter()
    comp = compare_latencies({"hang": hang, "fast": fast},
                             policy=ComparePolicy(call_timeout_s=0.2))
    assert time.perf_counter() - start < 5.0
    assert comp.failed["hang"].startswith("CallTimeout: no result after 0.2 s")
    assert comp.ranking == ["fast"] and comp.confidence == 1.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@needs_signal
def test_the_watchdog_is_armed_around_the_timer_for_every_call(sigalrm_restored: None) -> None:
    """Armed before ``Timer.sample`` starts its clock, for warmup and timed calls alike."""
    armed: list[bool] = []

    class ArmedTimer(ScriptedTimer):
        def sample(self, fn: Callable[[], object]) -> float:
            armed.append(signal.getitimer(signal.ITIMER_REAL)[0] > 0)
            return super().sample(fn)

    timer = ArmedTimer({"a": 100.0, "b": 200.0})
    compare_latencies(timer.fns(), timer=timer,
                      policy=ComparePolicy(call_timeout_s=60.0, budget_s=10.0))
    assert len(armed) == sum(timer.calls.values()) > 4
    assert all(armed)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@needs_signal
def test_the_watchdog_restores_the_previous_handler_and_timer(sigalrm_restored: None) -> None:
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    with watchdog(5.0):
        assert signal.getsignal(signal.SIGALRM) is not signal.SIG_IGN
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 5.0
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_IGN
    assert 90.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 100.0
    with pytest.raises(ValueError), watchdog(5.0):
        raise ValueError("the body failed")
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_IGN
    assert 90.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 100.0


def test_the_watchdog_chains_another_sigalrm_handler(sigalrm_restored: None) -> None:
    """pytest-timeout's signal method owns SIGALRM while a test runs: the watchdog still
    cuts a hanging call short, and their alarm still fires at their time."""
    fired: list[float] = []

    def theirs(signum: int, frame: FrameType | None) -> None:
        fired.append(time.monotonic())

    signal.signal(signal.SIGALRM, theirs)
    signal.setitimer(signal.ITIMER_REAL, 0.6)
    started = time.monotonic()
    assert watchdog_available()
    with pytest.raises(CallTimeout), watchdog(0.1):
        time.sleep(5)
    assert time.monotonic() - started < 0.5
    assert signal.getsignal(signal.SIGALRM) is theirs
    left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert 0.0 < left <= 0.6
    time.sleep(left + 0.2)
    assert len(fired) == 1 and fired[0] - started >= 0.55  # their alarm, at their time
    # their alarm falling inside a watched call is theirs, not a timeout
    fired.clear()
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    with watchdog(1.0):
        time.sleep(0.3)
    assert len(fired) == 1
    for off in (None, 0.0, -1.0):
        with watchdog(off):
            assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_watchdog_does_nothing_off_the_main_thread(sigalrm_restored: None) -> None:
    seen: dict[str, object] = {}

    def work() -> None:
        seen["available"] = watchdog_available()
        try:
            with watchdog(0.05):
                seen["timer"] = signal.getitimer(signal.ITIMER_REAL)
                time.sleep(0.2)
        except BaseException as exc:  # reported below, not lost in the thread
            seen["raised"] = exc

    before = signal.getsignal(signal.SIGALRM)
    worker = threading.Thread(target=work)
    worker.start()
    worker.join(10.0)
    assert not worker.is_alive()
    assert seen == {"available": False, "timer": (0.0, 0.0)}
    assert signal.getsignal(signal.SIGALRM) is before
