"""The interleaved comparison survives kernels that raise, hang or crawl.

Most tests drive ``compare_latencies`` with a scripted timer (fake nanoseconds per
candidate and call), so they count calls and rounds instead of timing anything; the
few real-time checks assert only coarse upper bounds far from what they measure.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType

import pytest

from pytest_arbiter.errors import CallTimeout
from pytest_arbiter.timing.measure import ComparePolicy, compare_latencies
from pytest_arbiter.timing.watchdog import watchdog, watchdog_available

# a time per candidate, or a function of the call's number (1-based, warmup included)
Script = Mapping[str, float | Callable[[int], float]]


class ScriptedTimer:
    """Every call of a candidate "takes" its scripted nanoseconds; a candidate listed in
    ``raise_on`` raises on that call (1-based, warmup calls included)."""

    def __init__(self, times: Script, raise_on: Mapping[str, int] | None = None) -> None:
        self.times = dict(times)
        self.raise_on = dict(raise_on or {})
        self.calls = dict.fromkeys(self.times, 0)
        self.last = ""

    def fns(self) -> dict[str, Callable[[], object]]:
        def make(name: str) -> Callable[[], object]:
            def run() -> None:
                self.calls[name] += 1
                self.last = name
                if self.calls[name] == self.raise_on.get(name):
                    raise RuntimeError(f"{name} broke on call {self.calls[name]}")

            return run

        return {n: make(n) for n in self.times}

    def sample(self, fn: Callable[[], object]) -> float:
        fn()
        took = self.times[self.last]
        return took(self.calls[self.last]) if callable(took) else took


needs_signal = pytest.mark.skipif(not watchdog_available(),
                                  reason="the SIGALRM watchdog cannot be used here "
                                         "(no setitimer, not the main thread, or another "
                                         "SIGALRM handler such as pytest-timeout's)")


@pytest.fixture
def sigalrm_restored() -> Iterator[None]:
    """Put SIGALRM's handler and real-time timer back as they were, whatever the test did."""
    if not hasattr(signal, "setitimer"):
        pytest.skip("no signal.setitimer on this platform")
    handler = signal.getsignal(signal.SIGALRM)
    left, interval = signal.getitimer(signal.ITIMER_REAL)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if handler is None else handler)
        if left > 0:
            signal.setitimer(signal.ITIMER_REAL, left, interval)


# -- kernels that raise -----------------------------------------------------------------


def test_a_candidate_raising_in_its_fifth_timed_round_is_failed_and_the_rest_ranked() -> None:
    """The fastest candidate raises in round 5 (its 7th call after 2 warmup calls): it is
    out, called no more, and round 5 counts for nobody; the others are ranked as usual."""
    timer = ScriptedTimer({"boom": 90.0, "fast": 100.0, "mid": 120.0}, raise_on={"boom": 7})
    policy = ComparePolicy(warmup=2, min_rounds=7, max_rounds=12, budget_s=10.0)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    assert comp.failed == {"boom": "RuntimeError: boom broke on call 7"}
    assert comp.ranking == ["fast", "mid"]
    assert "boom" not in comp.stats and "boom" not in comp.ratios
    assert timer.calls["boom"] == 7
    # fast beats mid every round: the sign test stops at 10 kept rounds, as without boom;
    # the void round 5 is in nobody's samples
    assert comp.rounds == 10
    assert comp.stats["fast"].samples == comp.stats["mid"].samples == 10
    assert timer.calls["fast"] in (12, 13)  # 2 warmup + 10 kept (+1 if before boom in round 5)
    assert comp.ratios["mid"] == pytest.approx(1.2)
    assert comp.dropped == {}


def test_a_candidate_raising_in_warmup_is_never_timed() -> None:
    timer = ScriptedTimer({"boom": 50.0, "fast": 100.0, "slow": 130.0}, raise_on={"boom": 1})
    policy = ComparePolicy(min_rounds=5, max_rounds=12, budget_s=10.0)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    assert comp.failed == {"boom": "RuntimeError: boom broke on call 1"}
    assert timer.calls["boom"] == 1
    assert comp.ranking == ["fast", "slow"]
    assert set(comp.stats) == {"fast", "slow"}


def test_every_candidate_failing_gives_an_empty_ranking_not_an_exception() -> None:
    """One fails in warmup, the other in its first timed round; gc is switched back on."""
    timer = ScriptedTimer({"a": 1.0, "b": 2.0}, raise_on={"a": 2, "b": 3})
    assert gc.isenabled()
    comp = compare_latencies(timer.fns(), policy=ComparePolicy(warmup=2), timer=timer)
    assert comp.ranking == [] and comp.stats == {} and comp.ratios == {}
    assert comp.confidence == 0.0 and not comp.tie
    assert comp.failed == {"a": "RuntimeError: a broke on call 2",
                           "b": "RuntimeError: b broke on call 3"}
    assert timer.calls == {"a": 2, "b": 3}
    assert gc.isenabled()


def test_a_lone_survivor_is_the_pick() -> None:
    timer = ScriptedTimer({"boom": 50.0, "only": 100.0}, raise_on={"boom": 4})
    comp = compare_latencies(timer.fns(), policy=ComparePolicy(warmup=2, min_rounds=7),
                             timer=timer)
    assert comp.ranking == ["only"]
    assert comp.confidence == 1.0 and not comp.tie
    assert comp.stats["only"].samples == comp.rounds >= 3
    assert comp.ratios == {"only": 1.0}


# -- kernels that crawl -----------------------------------------------------------------


def test_a_crawler_is_dropped_after_its_first_call_and_ranked_last() -> None:
    """2 s a call against a 10 ms budget: listed first and tiered higher, so its first
    warmup call comes before any other call; it is dropped once the fast one has run."""
    timer = ScriptedTimer({"crawler": 2e9, "fast": 1e4})
    policy = ComparePolicy(budget_s=0.01)
    comp = compare_latencies(timer.fns(), tiers={"crawler": 5, "fast": 0}, policy=policy,
                             timer=timer)
    assert timer.calls["crawler"] == 1
    assert list(comp.dropped) == ["crawler"]
    assert "2 s" in comp.dropped["crawler"] and "0.01 s" in comp.dropped["crawler"]
    assert comp.ranking == ["fast", "crawler"]
    assert comp.stats["crawler"].samples == 1 and comp.stats["crawler"].median_ns == 2e9
    assert comp.ratios["crawler"] == pytest.approx(2e5)
    assert comp.failed == {}
    assert comp.confidence == 1.0  # the fast one is left alone: the pick


def test_a_crawler_is_ranked_last_even_with_a_faster_median() -> None:
    """Faster than the rest except for one 0.5 s call in round 3: never the pick."""
    timer = ScriptedTimer({"crawler": lambda call: 5e8 if call == 5 else 90.0,
                           "fast": 100.0, "mid": 110.0})
    policy = ComparePolicy(warmup=2, min_rounds=7, max_rounds=12, budget_s=0.01)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    assert list(comp.dropped) == ["crawler"]
    assert timer.calls["crawler"] == 5
    assert comp.ranking == ["fast", "mid", "crawler"]
    assert comp.stats["crawler"].samples == 3  # rounds 1 to 3: the round it crawled in stays
    assert comp.stats["crawler"].median_ns == 90.0
    assert comp.ratios["crawler"] == pytest.approx(0.9)
    assert comp.stats["fast"].samples == comp.rounds


def test_all_slow_candidates_are_not_dropped_and_get_one_round() -> None:
    """1 s a call each against a 2 s cap: nobody is 10x another, so nobody is dropped;
    warmup stops at the cap, and the one round there always is runs."""
    timer = ScriptedTimer({"a": 1e9, "b": 1.1e9})
    comp = compare_latencies(timer.fns(), policy=ComparePolicy(budget_s=0.01, cap_s=2.0),
                             timer=timer)
    assert comp.dropped == {} and comp.failed == {}
    assert comp.rounds == 1
    assert timer.calls == {"a": 2, "b": 2}  # 1 warmup call (the cap is reached) and 1 round
    assert comp.ranking == ["a", "b"]


def test_a_real_crawler_costs_about_one_call() -> None:
    """0.25 s a call: the old rules forced 9 calls (2.25 s); now one."""
    def crawler() -> None:
        time.sleep(0.25)

    def fast() -> None:
        pass

    start = time.perf_counter()
    comp = compare_latencies({"crawler": crawler, "fast": fast},
                             policy=ComparePolicy(budget_s=0.01))
    assert time.perf_counter() - start < 1.5
    assert list(comp.dropped) == ["crawler"]
    assert comp.ranking == ["fast", "crawler"]


def test_real_slow_candidates_stop_after_one_round() -> None:
    """Two 50 ms kernels and a 0.1 s cap: warmup and one round, not 7 rounds."""
    calls = {"a": 0, "b": 0}

    def make(name: str) -> Callable[[], object]:
        def run() -> None:
            calls[name] += 1
            time.sleep(0.05)

        return run

    start = time.perf_counter()
    comp = compare_latencies({n: make(n) for n in calls},
                             policy=ComparePolicy(budget_s=0.001, cap_s=0.1))
    assert time.perf_counter() - start < 3.0
    assert calls in ({"a": 2, "b": 2}, {"a": 3, "b": 2})  # warmup stops at the cap
    assert comp.rounds == 1 and comp.dropped == {}


# -- kernels that hang: the watchdog -----------------------------------------------------


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
