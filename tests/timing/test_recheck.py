"""Re-checking a cached winner: real kernels decide, a tie never alarms, the budget holds.

The real-kernel tests time ``np.sin`` over slices of one array (cost linear in the
slice) and assert only verdicts; on a loaded machine even those can flip, so they are
marked ``timing`` (the slow tier). The rule's arithmetic is pinned with a scripted timer
that counts rounds instead of timing anything, in the quick tier.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from pytest_arbiter.timing.measure import ComparePolicy
from pytest_arbiter.timing.recheck import (
    RecheckPolicy,
    RecheckResult,
    RunBudget,
    recheck,
    rounds_for_verdict,
)
from tests.factories import ScriptedTimer

X = np.random.default_rng(0).uniform(0.5, 1.5, 20_000)


def sin_work(n: int) -> Callable[[], object]:
    """A real kernel: ``np.sin`` over ``n`` elements into its own buffer."""
    xs = X[:n].copy()
    out = np.empty(n)
    return lambda: np.sin(xs, out=out)


def test_defaults_follow_the_comparison() -> None:
    policy = RecheckPolicy()
    assert policy.margin == ComparePolicy().tie_margin
    assert policy.alpha == ComparePolicy().alpha
    assert policy.key_budget_s == 0.010


@pytest.mark.timing
def test_a_winner_made_twice_as_slow_is_flagged() -> None:
    result = recheck("winner", {"winner": sin_work(4000), "runner_up": sin_work(2000)})
    assert result.stale and result.faster == "runner_up"
    assert result.ratio > 1.5 and result.p_value < 1e-3
    assert result.rounds >= RecheckPolicy().min_rounds


@pytest.mark.timing
def test_a_faster_winner_is_not_flagged() -> None:
    result = recheck("winner", {"winner": sin_work(2000), "runner_up": sin_work(4000)})
    assert not result.stale and result.faster is None and result.ratio < 1.0


@pytest.mark.timing
def test_an_identical_pair_is_never_flagged() -> None:
    # one kernel on one buffer under two names: any difference is the machine's noise
    # (two buffers can differ for real, by their alignment in the caches)
    work = sin_work(2000)
    flagged = [r for r in (recheck("a", {"a": work, "b": work}) for _ in range(40))
               if r.stale]
    assert flagged == []


@pytest.mark.timing
def test_the_fastest_of_several_challengers_is_named() -> None:
    result = recheck("w", {"w": sin_work(4000), "a": sin_work(3000), "b": sin_work(1500)})
    assert result.faster == "b"


def test_a_tie_settles_early_and_a_gap_within_the_margin_is_no_alarm() -> None:
    # every round alike: the winner is never slower by more than the margin, so the
    # rounds stop as soon as a verdict may be taken
    for slower in (1000.0, 1005.0):
        timer = ScriptedTimer({"w": slower, "o": 1000.0})
        result = recheck("w", timer.fns(), timer=timer)
        assert not result.stale and result.rounds == RecheckPolicy().min_rounds


def test_a_stale_winner_runs_the_budget_and_is_flagged() -> None:
    timer = ScriptedTimer({"w": 1200.0, "o": 1000.0})
    result = recheck("w", timer.fns(), timer=timer,
                     policy=RecheckPolicy(max_rounds=15))
    assert result.stale and result.rounds == 15
    assert result.ratio == pytest.approx(1.2) and result.p_value == 2.0**-15


def test_bonferroni_family_needs_more_evidence() -> None:
    timer = ScriptedTimer({"w": 1200.0, "o": 1000.0})
    result = recheck("w", timer.fns(), timer=timer,
                     policy=RecheckPolicy(max_rounds=15, family=1000))
    assert not result.stale and result.p_value == 2.0**-15


def test_the_cap_stops_the_rounds_and_too_few_rounds_give_no_verdict() -> None:
    # 1 ms a call: a cap at the 10 ms budget has room for a handful of rounds, no verdict
    timer = ScriptedTimer({"w": 2e6, "o": 1e6})
    result = recheck("w", timer.fns(), timer=timer, policy=RecheckPolicy(key_cap_s=0.01))
    assert 1 <= result.rounds < RecheckPolicy().min_rounds
    assert not result.stale and "needed for a verdict" in result.detail
    assert result.timed_ns <= 12e6


def test_rounds_for_a_verdict() -> None:
    assert [rounds_for_verdict(1e-3, lost) for lost in (0, 1, 2)] == [10, 14, 18]
    assert rounds_for_verdict(0.05) == 5 and rounds_for_verdict(1e-3 / 200, 1) == 23
    with pytest.raises(ValueError):
        rounds_for_verdict(0.0)


@pytest.mark.parametrize("slower", [2.0, 45.0])
def test_a_slow_pair_buys_past_the_budget_the_rounds_a_verdict_needs(slower: float) -> None:
    # a winner made 45x slower takes 45 ms a call: past the 10 ms budget before its warmup
    # ends, it still gets the 14 rounds in which a clear gap is flagged with one round lost
    timer = ScriptedTimer({"w": slower * 1e6, "o": 1e6})
    policy = RecheckPolicy()
    result = recheck("w", timer.fns(), timer=timer)
    assert result.stale and result.faster == "o" and result.detail == ""
    assert result.rounds == rounds_for_verdict(policy.alpha, policy.lost_rounds) == 14
    assert result.p_value == 2.0**-14
    assert result.timed_ns == result.rounds * (slower + 1) * 1e6  # the warmup aside
    # a pair too slow for the cap: no round past it, and no verdict
    timer = ScriptedTimer({"w": 200e6, "o": 1e6})
    result = recheck("w", timer.fns(), timer=timer)
    assert not result.stale and "needed for a verdict" in result.detail
    assert result.timed_ns <= policy.key_cap_s * 1e9


def test_two_challengers_and_a_family_need_more_rounds() -> None:
    timer = ScriptedTimer({"w": 45e6, "a": 1e6, "b": 1.2e6})
    result = recheck("w", timer.fns(), timer=timer)
    assert result.stale and result.faster == "a"
    assert result.rounds == rounds_for_verdict(1e-3 / 2, 1) == 15
    timer = ScriptedTimer({"w": 3e6, "o": 1e6})
    result = recheck("w", timer.fns(), timer=timer, policy=RecheckPolicy(family=200))
    assert result.stale and result.rounds == 23


@pytest.mark.timing
def test_real_kernels_a_winner_made_45x_slower_is_stale_with_the_defaults() -> None:
    quick = sin_work(20_000)

    def slow() -> None:
        for _ in range(45):
            quick()

    result = recheck("w", {"w": slow, "o": sin_work(20_000)})
    assert result.stale and result.ratio > 20, result
    assert result.rounds >= RecheckPolicy().min_rounds


@pytest.mark.timing
def test_real_kernels_stop_at_the_budget() -> None:
    slow, quick = sin_work(20_000), sin_work(10_000)
    tight = recheck("w", {"w": slow, "o": quick}, policy=RecheckPolicy(key_budget_s=0.005))
    roomy = recheck("w", {"w": slow, "o": quick}, policy=RecheckPolicy(key_budget_s=0.1))
    assert tight.rounds < roomy.rounds
    assert tight.timed_ns < 0.1e9 / 2


def test_a_winner_that_raises_gets_no_verdict() -> None:
    def broken() -> None:
        raise RuntimeError("kernel edit broke it")

    result = recheck("w", {"w": broken, "o": sin_work(100)})
    assert not result.stale and "w raised: RuntimeError: kernel edit broke it" in result.detail


def test_nothing_to_recheck_against_and_an_unknown_winner() -> None:
    alone = recheck("w", {"w": sin_work(10)})
    assert alone == RecheckResult("w", None, 1.0, 1.0, 0, 0, 0, "nothing to re-time it against")
    with pytest.raises(ValueError, match="'x' is not among"):
        recheck("x", {"w": sin_work(10)})


@pytest.mark.parametrize("bad", [{"key_budget_s": 0.0}, {"alpha": 1.5}, {"margin": -0.1},
                                 {"family": 0}, {"settle_alpha": 0.0}, {"key_cap_s": 0.0},
                                 {"lost_rounds": -1}])
def test_policy_is_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RecheckPolicy(**bad)  # type: ignore[arg-type]


def test_run_budget_is_shared_safely_by_threads() -> None:
    budget = RunBudget(1.0)
    slice_s = 1 / 1024  # exact in binary: the total is exactly 1024 slices
    granted = [0] * 8
    start = threading.Barrier(8)

    def worker(i: int) -> None:
        start.wait()
        for _ in range(300):
            if budget.take(slice_s):
                granted[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(granted) == 1024 and budget.left_s == 0.0
    assert not budget.take(slice_s)
    budget.settle(slice_s, 0.0)  # reserved, then nothing spent: it comes back
    assert budget.take(slice_s) and not budget.take(1e-9)
    budget.settle(slice_s, slice_s / 2)
    assert budget.left_s == slice_s / 2
    budget.settle(0.0, 1.0)  # an overrun is charged, down to nothing left
    assert budget.left_s == 0.0
    with pytest.raises(ValueError):
        RunBudget(-1.0)
