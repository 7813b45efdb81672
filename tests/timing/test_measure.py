"""The interleaved comparison: when it stops and what is a tie, and how it survives
kernels that raise or crawl (those that hang: test_watchdog.py).

Most tests drive ``compare_latencies`` with a scripted timer (fake nanoseconds per
candidate and call), so they count calls and rounds instead of timing anything; the
few real-time checks assert only coarse upper bounds far from what they measure.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import numpy as np
import pytest

from pytest_arbiter.timing.measure import ComparePolicy, Comparison, compare_latencies
from pytest_arbiter.timing.pairing import bound_rank, ratio_upper
from tests.factories import ScriptedTimer

# -- kernels that raise -----------------------------------------------------------------


def test_a_candidate_raising_in_its_fifth_timed_round_is_failed_and_the_rest_ranked() -> None:
    """The fastest candidate raises in round 5 (its 7th call after 2 warmup calls): it is
    out, called no more, and round 5 counts for nobody; the others are ranked as usual."""
    timer = ScriptedTimer({"boom": 90.0, "fast": 100.0, "mid": 120.0}, raise_on={"boom": 7})
    # calls scripted by their number: no lead-ins between them
    policy = ComparePolicy(warmup=2, min_rounds=7, max_rounds=12, budget_s=10.0, lead_in_s=0)
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


def _machine_compare(times: dict[str, tuple[int, ...]], preempted: set[int],
                     slowdown: int) -> tuple[Comparison, dict[str, int]]:
    """A comparison on a scripted machine with a CPU clock (each call ``times`` CPU
    nanoseconds; the calls numbered in ``preempted``, 0-based over all calls, take
    ``slowdown`` times that on the wall), and each candidate's number of calls."""
    from tests.timing.test_rounds_differential import Machine, Script

    machine = Machine(Script(times, {}, frozenset(), frozenset(preempted), slowdown))
    comp = compare_latencies(machine.fns(), policy=ComparePolicy(budget_s=0.01, lead_in_s=0),
                             timer=machine, clocks=machine.clocks(cpu=True))
    return comp, machine.made


def test_a_preempted_call_of_a_fast_kernel_does_not_make_it_a_crawler() -> None:
    """The fast kernel's first call, 10 us of CPU, is preempted to 200 ms of wall time:
    over the crawl bound and 200x the other's 1 ms. It is timed once more before it
    could be dropped, runs its 10 us, and stays the pick."""
    comp, made = _machine_compare({"fast": (10_000,), "slow": (1_000_000,)}, {0}, 20_000)
    assert comp.dropped == {}
    assert comp.ranking == ["fast", "slow"]
    assert made["fast"] == made["slow"] + 1  # the one retry


def test_a_crawler_is_dropped_on_its_second_call_timed_at_once() -> None:
    """A crawler whose 0.3 s call was its own CPU time, and one whose calls wait (1 ms of
    CPU, 0.3 s of wall: a sleep, other threads' work), are timed once more at once and
    dropped on the faster of their two calls; one that waits 1.5 s leaves no room under
    the 2 s cap for a second call and as long again, and is dropped on the call it made."""
    comp, made = _machine_compare({"crawler": (300_000_000,), "fast": (10_000,)}, set(), 1)
    assert list(comp.dropped) == ["crawler"] and made["crawler"] == 2
    assert comp.dropped["crawler"].startswith("its fastest of 2 calls took 300 ms")
    comp, made = _machine_compare({"crawler": (1_000_000,), "fast": (10_000,)},
                                  {0, 2}, 300)
    assert list(comp.dropped) == ["crawler"] and made["crawler"] == 2
    assert "300 ms" in comp.dropped["crawler"]
    assert comp.timed_ns >= 300_000_000  # the second is a timed call too
    comp, made = _machine_compare({"crawler": (1_000_000,), "fast": (10_000,)},
                                  {0}, 1_500)
    assert list(comp.dropped) == ["crawler"] and made["crawler"] == 1
    assert comp.dropped["crawler"].startswith("its one call took 1.5 s")


def test_slow_first_calls_make_no_crawler_when_a_later_call_is_fast() -> None:
    """A's first two calls are slow (a preempted 10 us, then 150 ms of its own CPU: a
    compile, a cold cache), the rest 0.5 ms; B's 50 ms twice, then 1 ms. Judged on its
    fastest call, A is no crawler: the rounds rank it first."""
    comp, _ = _machine_compare({"A": (10_000, 150_000_000) + (500_000,) * 200,
                                "B": (50_000_000, 50_000_000) + (1_000_000,) * 200},
                               {0}, 20_000)
    assert comp.dropped == {}
    assert comp.ranking == ["A", "B"] and comp.ratios["B"] == pytest.approx(2.0)


def test_one_stalled_call_makes_no_crawler() -> None:
    """Faster than the rest but for one 0.5 s call in round 3 (two BLAS thread pools
    contending stall a call for 100-200 ms): judged on its fastest call, it stays in
    the rounds, and their paired ratios make it the pick."""
    timer = ScriptedTimer({"stalls": lambda call: 5e8 if call == 5 else 90.0,
                           "fast": 100.0, "mid": 110.0})
    policy = ComparePolicy(warmup=2, min_rounds=7, max_rounds=12, budget_s=0.01, lead_in_s=0)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    assert comp.dropped == {}
    assert comp.ranking == ["stalls", "fast", "mid"]
    assert comp.ratios["fast"] == pytest.approx(100 / 90)
    assert comp.stats["stalls"].samples == comp.rounds
    assert comp.stats["stalls"].max_ns == 5e8  # the stall is in its statistics


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


@pytest.mark.timing
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


def test_a_pick_beside_a_crawler_gets_the_rounds_a_ranking_of_two_needs() -> None:
    """The runner-up crawls (one call 1000x the pick's and past 10x the budget): it is
    timed no more, and the pick alone is timed until the rounds a ranking of two needs
    (min_rounds), not the few a lone candidate gets: its entry is not low-confidence on
    its rounds with confidence 1."""
    timer = ScriptedTimer({"fast": 1e3, "crawler": 1e9})
    comp = compare_latencies(timer.fns(), policy=ComparePolicy(min_rounds=7), timer=timer)
    assert comp.ranking == ["fast", "crawler"] and set(comp.dropped) == {"crawler"}
    assert comp.rounds == 7 and comp.confidence == 1.0
    lone = ScriptedTimer({"fast": 1e3})
    assert compare_latencies(lone.fns(), policy=ComparePolicy(min_rounds=7),
                             timer=lone).rounds == 3


# -- the rules of a comparison: when it stops, what is a tie -----------------------------


def test_clear_winner_stops_early_with_high_confidence() -> None:
    timer = ScriptedTimer({"slow": 105.0, "fast": 100.0})
    policy = ComparePolicy(min_rounds=7, max_rounds=200, budget_s=10.0, alpha=1e-3)
    comp = compare_latencies(timer.fns(), tiers={"slow": 1, "fast": 0},
                             policy=policy, timer=timer)
    assert comp.ranking == ["fast", "slow"]
    assert not comp.tie
    assert comp.rounds == 10  # 2**-10 < 1e-3: the sign test's first chance to stop
    assert comp.confidence == pytest.approx(1.0 - 2.0**-10)
    assert comp.ratios["slow"] == pytest.approx(1.05)
    assert comp.timed_ns == pytest.approx(10 * 2 * 205.0)  # each call after its lead-in


def test_difference_inside_the_noise_is_a_tie_won_by_the_higher_tier() -> None:
    timer = ScriptedTimer({"fast": 100.0, "tiered": 100.0})
    policy = ComparePolicy(min_rounds=5, max_rounds=12, budget_s=10.0)
    comp = compare_latencies(timer.fns(),
                             tiers={"fast": 0, "tiered": 2}, policy=policy, timer=timer)
    assert comp.tie
    assert comp.ranking[0] == "tiered"
    assert comp.rounds == 12  # equal times never win a round: no early stop
    assert comp.confidence == pytest.approx(0.0)


@pytest.mark.parametrize("trials", [1, 2, 5, 6, 7, 8, 13, 20, 50, 200])
@pytest.mark.parametrize("below", [0.01, 0.05])
def test_the_bound_rank_is_the_binomial_tails(trials: int, below: float) -> None:
    """The largest rank k with P(Binomial(n, 1/2) <= k - 1) <= below, against SciPy's
    binomial CDF: too few rounds (6 at 0.01) bound nothing."""
    from scipy.stats import binom

    expected = max((k for k in range(1, trials + 1)
                    if binom.cdf(k - 1, trials, 0.5) <= below), default=0)
    assert bound_rank(trials, below) == expected
    assert (bound_rank(6, 0.01), bound_rank(7, 0.01), bound_rank(13, 0.01),
            bound_rank(200, 0.01)) == (0, 1, 2, 84)


def test_the_upper_bound_is_the_ranked_paired_ratio() -> None:
    """13 rounds at 0.01: rank 2, the second largest ratio; a leader that took no time
    in a round leaves that round out (12 rounds: rank 2 again)."""
    ratios = np.array([0.9, 1.0, 1.01, 1.02, 1.03, 0.95, 1.1, 1.2, 1.04, 1.05, 1.06, 1.07,
                       1.5])
    table = np.column_stack([np.full(13, 100.0), 100.0 * ratios])
    upper = ratio_upper(table, 0, 0.01)
    assert upper.tolist() == pytest.approx([1.0, 1.2])
    table[12, 0] = 0.0
    assert ratio_upper(table, 0, 0.01)[1] == pytest.approx(1.1)


def test_rounds_too_noisy_to_bound_the_gap_are_no_tie() -> None:
    """A tiered kernel 2.8x slower in some rounds and 2x faster in others (bursts of a
    loaded machine) is 0.5% behind on the median paired ratio and the leader's lead is
    not significant: once a tie handed it the pick. The rounds bound its ratio only
    under 2.8, so it is no tie; the measured leader is the pick, of low confidence."""
    pattern = {"fast": (100.0, 100.0, 100.0), "tiered": (50.0, 280.0, 100.5)}
    timer = ScriptedTimer({n: (lambda k, t=t: t[k % 3]) for n, t in pattern.items()})
    policy = ComparePolicy(warmup=2, min_rounds=5, max_rounds=13, budget_s=10.0, lead_in_s=0)
    comp = compare_latencies(timer.fns(), tiers={"fast": 0, "tiered": 2},
                             policy=policy, timer=timer)
    assert comp.rounds == 13
    assert comp.ratios["tiered"] == pytest.approx(1.005)
    assert not comp.tie
    assert comp.ranking == ["fast", "tiered"]
    assert comp.confidence == pytest.approx(1.0 - 2380 / 8192)  # 8 wins of 13 rounds


def test_rounds_that_bound_the_gap_within_the_margin_are_a_tie() -> None:
    """The same kernels with a few percent of noise: the rounds bound the ratio under
    1.05, so the higher tier wins the tie."""
    pattern = {"fast": (100.0, 100.0, 100.0), "tiered": (98.0, 103.0, 100.0)}
    timer = ScriptedTimer({n: (lambda k, t=t: t[k % 3]) for n, t in pattern.items()})
    policy = ComparePolicy(warmup=2, min_rounds=5, max_rounds=13, budget_s=10.0)
    comp = compare_latencies(timer.fns(), tiers={"fast": 0, "tiered": 2},
                             policy=policy, timer=timer)
    assert comp.tie
    assert comp.ranking[0] == "tiered"


def test_small_but_significant_difference_is_not_a_tie() -> None:
    """Significant at tie_alpha: the measured leader wins although another is tiered higher."""
    timer = ScriptedTimer({"tiered": 100.5, "fast": 100.0})
    policy = ComparePolicy(min_rounds=5, max_rounds=8, budget_s=10.0, tie_margin=0.01)
    comp = compare_latencies(timer.fns(),
                             tiers={"fast": 0, "tiered": 2}, policy=policy, timer=timer)
    assert not comp.tie
    assert comp.ranking[0] == "fast"


def test_the_cap_stops_before_a_round_would_overrun_it() -> None:
    """Each round claims 2 ms; a tie never gets confident, so only the 10 ms cap ends it."""
    timer = ScriptedTimer({"a": 1e6, "b": 1e6})
    policy = ComparePolicy(min_rounds=3, max_rounds=100, budget_s=0.001, cap_s=0.01)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    assert 1 <= comp.rounds < 100
    assert comp.timed_ns <= policy.cap_s * 1e9
    assert comp.spent_ns > 0


def test_the_soft_budget_stops_a_clear_pick_once_it_is_confident() -> None:
    """Rounds of 3 ms past a 1 ms budget: a 2x gap stops when the sign test first reaches
    the confidence target (7 rounds), not before and not at the cap."""
    timer = ScriptedTimer({"a": 1e6, "b": 2e6})
    policy = ComparePolicy(min_rounds=3, max_rounds=100, budget_s=0.001, cap_s=10.0,
                           alpha=1e-9)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    assert comp.ranking[0] == "a" and comp.rounds == 7 and comp.confidence >= 0.99


def test_paired_ratios_follow_the_leader_per_round() -> None:
    """A drift that slows whole rounds does not change the paired ratio."""
    drift = iter(float(i) for i in range(1, 10_000))
    state = {"scale": 1.0}

    class DriftingTimer(ScriptedTimer):
        def sample(self, fn: Callable[[], object]) -> float:
            fn()
            if self.last == "b":
                state["scale"] = next(drift)
            return self.times[self.last] * state["scale"]

    timer = DriftingTimer({"a": 100.0, "b": 110.0})
    policy = ComparePolicy(min_rounds=5, max_rounds=9, budget_s=100.0, alpha=1e-9, seed=3)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    assert comp.ranking[0] == "a"
    assert 1.0 < comp.ratios["b"]


def test_paired_ratios_in_a_cycle_keep_the_leader_first() -> None:
    """A beats B, B beats C and C beats A, each round for round: no candidate is beaten
    by none. The pick is the leader every ratio is to (its own 1.0), not the one whose
    ratio to it sorts lowest; so a runner-up's ratio says how it fares against the
    pick."""
    cycle = [{"A": 1000, "B": 2000, "C": 3000}, {"A": 3000, "B": 1000, "C": 2000},
             {"A": 2000, "B": 3000, "C": 1000}]
    calls = {n: iter([1000] * 2 + [r[n] for r in cycle * 3]) for n in "ABC"}
    fns = {n: (lambda n=n: n) for n in "ABC"}

    class CyclingTimer:
        def sample(self, fn: Callable[[], object]) -> float:
            return float(next(calls[str(fn())]))

    policy = ComparePolicy(warmup=2, min_rounds=9, max_rounds=9, budget_s=100.0,
                           cap_s=1000.0, seed=0, lead_in_s=0)
    comp = compare_latencies(fns, policy=policy, timer=CyclingTimer())
    assert comp.rounds == 9
    assert comp.ratios[comp.ranking[0]] == 1.0
    assert min(comp.ratios.values()) < 1.0  # the cycle: one of the rest beats the pick


class CarryOverTimer:
    """Each call takes ``after[(previous call's name, its name)]`` nanoseconds, else
    ``alone[name]``: what a neighbour left in the caches speeds or slows a short call."""

    def __init__(self, alone: dict[str, float], after: dict[tuple[str, str], float]) -> None:
        self.alone, self.after = alone, after
        self.previous = ""
        self.timed: list[str] = []

    def fns(self) -> dict[str, Callable[[], object]]:
        return {n: (lambda n=n: n) for n in self.alone}

    def sample(self, fn: Callable[[], object]) -> float:
        name = str(fn())
        took = self.after.get((self.previous, name), self.alone[name])
        self.previous = name
        self.timed.append(name)
        return took


def test_a_neighbours_carry_over_does_not_pick_the_kernel() -> None:
    """``warm`` takes 1.0 us called again and again, 1.2 us after another kernel (its
    code cold); ``steady`` takes 1.1 us whatever ran before. In rounds of one call each,
    ``warm`` always follows the other or the rounds' bookkeeping, so the rounds once
    picked ``steady`` with full confidence. With a lead-in before each timed call, each
    is timed as it runs called again and again, and ``warm`` is the pick."""
    timer = CarryOverTimer({"warm": 1200.0, "steady": 1100.0}, {("warm", "warm"): 1000.0})
    comp = compare_latencies(timer.fns(), policy=ComparePolicy(), timer=timer)
    assert comp.ranking == ["warm", "steady"]
    assert comp.confidence > 0.999
    assert comp.ratios["steady"] == pytest.approx(1.1)
    # a kept round is 4 calls: each candidate's lead-in, then its timed call
    assert len(timer.timed) == 2 * 2 + 4 * comp.rounds


def test_long_calls_get_no_lead_in() -> None:
    """Calls over ``lead_in_s`` dwarf what a neighbour leaves: a lead-in would only
    double their rounds' cost."""
    timer = ScriptedTimer({"a": 200e3, "b": 220e3})
    comp = compare_latencies(timer.fns(), policy=ComparePolicy(lead_in_s=100e-6), timer=timer)
    assert timer.samples == 2 * 2 + 2 * comp.rounds


def test_only_a_short_kernel_gets_a_lead_in() -> None:
    """Beside a 50 us kernel, a 20 ms one is called once a round: its own call dwarfs
    what a neighbour leaves, and a lead-in would double what dominates the cost."""
    timer = ScriptedTimer({"short": 50e3, "long": 20e6})
    policy = ComparePolicy(lead_in_s=100e-6, cap_s=10.0, budget_s=1.0)
    comp = compare_latencies(timer.fns(), policy=policy, timer=timer)
    warmup = policy.warmup
    assert timer.calls["long"] == warmup + comp.rounds
    assert timer.calls["short"] == warmup + 2 * comp.rounds


def test_gc_is_restored_after_a_comparison() -> None:
    import gc

    timer = ScriptedTimer({"a": 1.0, "b": 2.0})
    assert gc.isenabled()
    compare_latencies(timer.fns(), timer=timer)
    assert gc.isenabled()

    def boom() -> None:
        raise RuntimeError("kernel failed while timed")

    failed = compare_latencies({"a": boom, "b": boom}, timer=timer)
    assert failed.ranking == [] and set(failed.failed) == {"a", "b"}
    assert gc.isenabled()


def test_the_sign_test_holds_past_a_thousand_rounds() -> None:
    """2.0 ** 1024 overflows a float: the p-value is computed on whole numbers."""
    from fractions import Fraction
    from math import comb

    from pytest_arbiter.timing.pairing import sign_test_p, wins_needed

    assert sign_test_p(0, 2000) == 1.0
    exact = Fraction(sum(comb(2000, k) for k in range(1050, 2001)), 2**2000)
    assert sign_test_p(1050, 2000) == float(exact)
    assert 1000 < wins_needed(2000, 0.05) < 1100


def test_wins_needed_is_the_sign_tests_own_threshold() -> None:
    """The fewest wins whose p-value is under the level: one pass down the tail gives
    what asking the sign test at every count gives."""
    from pytest_arbiter.timing.pairing import sign_test_p, wins_needed

    for trials in range(0, 120):
        for below in (0.0, 1e-9, 0.01, 0.05, 0.2, 0.5, 1.0, 1.5):
            needed = wins_needed(trials, below)
            assert all(sign_test_p(w, trials) < below for w in range(needed, trials + 1))
            assert needed == 0 or not sign_test_p(needed - 1, trials) < below


def test_the_sign_test_is_the_binomial_tail_exactly() -> None:
    """The tail summed term by term (each coefficient from the one before, no comb() a
    term: a 2,000-round comparison asked every round) is the binomial tail, bit for
    bit."""
    import math

    from pytest_arbiter.timing.pairing import sign_test_p

    for trials in (1, 2, 7, 10, 33, 200, 1_023, 1_024, 2_000):
        for wins in sorted({0, 1, trials // 2, trials // 2 + 1, trials - 1, trials}):
            exact = sum(math.comb(trials, i) for i in range(wins, trials + 1))
            assert sign_test_p(wins, trials) == exact / (1 << trials), (wins, trials)
