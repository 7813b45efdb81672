"""No silent fallback: a dispatch the key's measured winner should have served, served
by another candidate (or the reference) because the winner cannot run here, is
``degraded`` under the winner's name, with the candidate that ran and the measured
slowdown; a decline of inputs the entry never measured is the ranking at work (``won``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import pytest

from pytest_arbiter import Arbiter, ComparePolicy, Decline, MeasureCache
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.ops import OpRegistry, make_op
from pytest_arbiter.timing.measure import compare_latencies

POLICY = ComparePolicy(min_rounds=7, max_rounds=40, budget_s=0.01)
WORKS = {"fast": True}


def fast(*args: Any) -> Any:
    if not WORKS["fast"]:
        raise Decline("a feature missing at run time")
    return _ref(*args)


def slow(*args: Any) -> Any:
    time.sleep(0.002)
    return _ref(*args)


def _ref(*args: Any) -> Any:
    return np.matmul(*args) if len(args) == 2 and np.ndim(args[1]) == 2 else args[0] * 2


@pytest.fixture(autouse=True)
def fast_works() -> None:
    WORKS["fast"] = True


def setup(op: str, *kernels: tuple[Callable[..., Any], str, Any]
          ) -> tuple[CandidateRegistry, OpRegistry]:
    ops = OpRegistry()
    ops.register(make_op("fb_twice", lambda x, *rest: x * 2))
    reg = CandidateRegistry()
    reg.extend(FunctionCandidate(k, name, op, "cpu", 0, accepts, None)
               for k, name, accepts in kernels)
    return reg, ops


def tuned(op: str, inputs: tuple[Any, ...], *kernels: tuple[Callable[..., Any], str, Any]
          ) -> MeasureCache:
    reg, ops = setup(op, *kernels)
    cache = MeasureCache()
    Arbiter(registry=reg, ops=ops, cache=cache, mode="tune", policy=POLICY).dispatch(
        op, *inputs)
    (entry,) = cache.entries()
    assert entry.winner == "fast"
    return cache


def replay(op: str, inputs: tuple[Any, ...], cache: MeasureCache,
           *kernels: tuple[Callable[..., Any], str, Any], times: int = 3) -> Arbiter:
    reg, ops = setup(op, *kernels)
    arb = Arbiter(registry=reg, ops=ops, cache=cache, mode="static")
    for _ in range(times):
        arb.dispatch(op, *inputs)
    return arb


def test_a_winner_declining_at_run_time_on_its_measured_shapes_is_a_degrade() -> None:
    a = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    pair = ((fast, "fast", None), (slow, "slow", None))
    cache = tuned("matmul", (a, a), *pair)
    WORKS["fast"] = False  # the gate sees it decline every input: the fast path knows
    arb = replay("matmul", (a, a), cache, *pair)
    assert arb.histogram.counts() == {("cpu", "matmul", "fast", "degraded"): 3}
    why = arb.reasons[("cpu", "matmul", "fast", "degraded")]
    assert "fast could not run here" in why and "slow ran instead" in why
    assert "x slower when measured" in why
    (event,) = arb.events.values()
    assert event.ran == "slow" and "slow ran instead" in event.fallback


def test_the_measured_slowdown_is_the_paired_ratio_show_prints() -> None:
    """The row's paired ratio ranked it and is what show prints: the degrade's reason
    says it too, not the ratio of the medians (1.61x where show said +65.1%)."""
    a = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    pair = ((fast, "fast", None), (slow, "slow", None))
    (entry,) = tuned("matmul", (a, a), *pair).entries()
    runner_up = msgspec.structs.replace(entry.ranking[1], ratio=7.25)
    assert entry.ranking[1].stats.median_ns / entry.ranking[0].stats.median_ns != 7.25
    cache = MeasureCache()
    cache.put(msgspec.structs.replace(entry, ranking=(entry.ranking[0], runner_up)))
    WORKS["fast"] = False
    arb = replay("matmul", (a, a), cache, *pair, times=1)
    why = arb.reasons[("cpu", "matmul", "fast", "degraded")]
    assert "slow ran instead, 7.25x slower when measured" in why, why


def test_the_slow_path_names_the_candidate_that_ran() -> None:
    x = np.arange(64.0)
    pair = ((fast, "fast", None), (slow, "slow", None))
    cache = tuned("fb_twice", (x,), *pair)
    WORKS["fast"] = False  # a user op: its decline is seen on every dispatch
    arb = replay("fb_twice", (x,), cache, *pair)
    assert arb.histogram.counts() == {("cpu", "fb_twice", "fast", "degraded"): 3}
    (event,) = arb.events.values()
    assert event.ran == "slow" and "slow ran instead" in event.fallback


def test_a_plain_number_input_does_not_hide_the_fallback() -> None:
    x = np.arange(64.0)
    pair = ((fast, "fast", None), (slow, "slow", None))
    cache = tuned("fb_twice", (x, 2.0), *pair)
    WORKS["fast"] = False
    arb = replay("fb_twice", (x, 2.0), cache, *pair)
    assert arb.histogram.counts() == {("cpu", "fb_twice", "fast", "degraded"): 3}


def test_a_decline_of_shapes_the_entry_did_not_measure_is_won() -> None:
    only_64 = lambda x: x.shape == (64,)  # noqa: E731
    kernels = ((fast, "fast", only_64), (slow, "slow", None))
    cache = tuned("fb_twice", (np.arange(64.0),), *kernels)
    arb = replay("fb_twice", (np.arange(48.0),), cache, *kernels)  # the same bucket
    (entry,) = cache.entries()
    assert next(iter(arb.events)).bucket == entry.bucket
    assert arb.histogram.counts() == {("cpu", "fb_twice", "slow", "won"): 3}


def test_a_missing_winner_with_nothing_else_is_a_degrade_not_no_candidate() -> None:
    x = np.arange(64.0)
    cache = tuned("fb_twice", (x,), (fast, "fast", None))
    reg, ops = setup("fb_twice", (fast, "fast", None))
    reg.add(FunctionCandidate(fast, "fast", "fb_twice", "cpu", 0, None, lambda: False),
            replace=True)
    arb = Arbiter(registry=reg, ops=ops, cache=cache, mode="static")
    np.testing.assert_allclose(arb.dispatch("fb_twice", x), x * 2)
    assert arb.histogram.counts() == {("cpu", "fb_twice", "fast", "degraded"): 1}
    assert "the reference ran instead" in arb.reasons[("cpu", "fb_twice", "fast", "degraded")]

    gone = replay("fb_twice", (x,), cache, (slow, "slow", None), times=1)
    assert gone.histogram.counts() == {("cpu", "fb_twice", "fast", "degraded"): 1}
    why = gone.reasons[("cpu", "fb_twice", "fast", "degraded")]
    assert "not registered" in why and "pytest-arbiter forget CACHE --candidate fast" in why


def test_a_lone_candidate_stops_at_the_cap() -> None:
    def sleeper() -> None:
        time.sleep(0.05)

    comp = compare_latencies({"only": sleeper}, policy=ComparePolicy(cap_s=0.12))
    assert comp.rounds == 1  # three rounds (the lone minimum) would overrun the cap


def wrong(*args: Any) -> Any:
    return _ref(*args) * 3


def test_the_event_says_the_reference_ran_when_the_gate_rejected_every_candidate() -> None:
    """A static run whose every candidate fails the gate: --arbiter-explain and the
    winners line say the reference ran, and the rejected ones are passed over."""
    x = np.arange(64.0)
    reg, ops = setup("fb_twice", (wrong, "wrong_a", None), (wrong, "wrong_b", None))
    arb = Arbiter(registry=reg, ops=ops, mode="static")
    np.testing.assert_allclose(arb.dispatch("fb_twice", x), x * 2)
    (event,) = arb.events.values()
    assert event.ran == "the reference"
    assert event.order == []
    assert set(event.passed_over) == {"wrong_a", "wrong_b"}
    assert "F4 gate" in event.passed_over["wrong_a"]


@pytest.mark.parametrize(("ratio", "why", "degraded", "margin"), [
    (1.004, "unavailable", False, None), (1.0, "unavailable", False, None),
    (1.012, "unavailable", True, None), (1.004, "declines", True, None),
    (1.004, "gone", True, None), (1.01, "unavailable", True, None),
    (1.05, "unavailable", False, 0.1), (1.05, "unavailable", True, 0.02)])
def test_a_fallback_as_fast_as_an_unavailable_winner_is_no_degrade(
        ratio: float, why: str, degraded: bool, margin: float | None) -> None:
    """The winner tied with the one that served (its paired ratio within the 1% tie
    margin, the tier decided) and cannot run on this machine (its ``available()`` says
    no: an optional package missing here): serving in its place loses nothing, so it is
    ``won``; 1.2% slower is a degrade, and so is a winner declining inputs of the shapes
    it was measured on (a bug, maybe) or one no longer registered, however fast. "As
    fast" is the arbiter's own tie margin (its ``ComparePolicy``), on the stored ratio."""
    a = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    pair = ((fast, "fast", None), (slow, "slow", None))
    (entry,) = tuned("matmul", (a, a), *pair).entries()
    cache = MeasureCache()
    cache.put(msgspec.structs.replace(entry, ranking=(
        entry.ranking[0], msgspec.structs.replace(entry.ranking[1], ratio=ratio))))
    reg = CandidateRegistry()
    if why != "gone":
        reg.add(FunctionCandidate(fast, "fast", "matmul", "cpu", 0, None,
                                  (lambda: "fastpkg is not installed")
                                  if why == "unavailable" else None))
    reg.add(FunctionCandidate(slow, "slow", "matmul", "cpu", 0, None, None))
    WORKS["fast"] = why != "declines"
    policy = ComparePolicy(tie_margin=margin) if margin is not None else None
    arb = Arbiter(registry=reg, cache=cache, mode="static", policy=policy)
    for _ in range(3):
        arb.dispatch("matmul", a, a)
    counts = arb.histogram.counts()
    if degraded:
        assert counts == {("cpu", "matmul", "fast", "degraded"): 3}, counts
    else:
        assert counts == {("cpu", "matmul", "slow", "won"): 3}, counts


def test_a_lost_device_lane_stops_the_dispatch_and_later_ones_say_why() -> None:
    """A candidate whose fault poisons its lane (device.mark_unusable): the faulting
    dispatch records the error and sends nothing more there; every later dispatch of
    any key of that target is no_candidate with the reason."""
    from pytest_arbiter.extend import device

    def poisoning(x: np.ndarray, *rest: Any) -> np.ndarray:
        device.mark_unusable("cpu", "a sticky fault poisoned the lane")
        raise RuntimeError("illegal address")

    reg, ops = setup("fb_twice", (poisoning, "poisoning", None), (slow, "slow", None))
    arb = Arbiter(registry=reg, ops=ops, mode="static", gate=False)
    try:
        arb.dispatch("fb_twice", np.arange(64.0))
        arb.dispatch("fb_twice", np.arange(64.0))
        arb.dispatch("fb_twice", np.arange(8.0))  # another key of the target
    finally:
        device.reset_unusable("cpu")
    counts = arb.histogram.counts()
    assert counts == {("cpu", "fb_twice", "poisoning", "error"): 1,
                      ("cpu", "fb_twice", "none", "no_candidate"): 2}, counts
    assert "poisoned the lane" in arb.reasons[("cpu", "fb_twice", "none", "no_candidate")]


def sized_slow(x: Any) -> Any:
    time.sleep(0.0002 if x.size < 1000 else 0.004)
    return x * 2


def test_the_reason_kept_is_the_worst_measured_slowdown() -> None:
    """One winner missing on two keys, its fallback slower on the second dispatched
    (4 ms sleeps) than on the first (0.2 ms): the entry's reason says the worst, not the
    first."""
    small, large = np.arange(64.0), np.arange(4096.0)
    reg, ops = setup("fb_twice", (fast, "fast", None), (sized_slow, "sized_slow", None))
    cache = MeasureCache()
    tuner = Arbiter(registry=reg, ops=ops, cache=cache, mode="tune", policy=POLICY)
    tuner.dispatch("fb_twice", small)
    tuner.dispatch("fb_twice", large)
    slowdown = sorted(e.ranking[1].ratio or 0.0 for e in cache.entries())
    assert [e.winner for e in cache.entries()] == ["fast", "fast"] and slowdown[1] > 2.0
    gone = CandidateRegistry()
    gone.extend([FunctionCandidate(fast, "fast", "fb_twice", "cpu", 0, None, lambda: False),
                 FunctionCandidate(sized_slow, "sized_slow", "fb_twice", "cpu", 0, None, None)])
    arb = Arbiter(registry=gone, ops=ops, cache=cache, mode="static")
    arb.dispatch("fb_twice", small)
    arb.dispatch("fb_twice", large)
    arb.dispatch("fb_twice", small)
    assert arb.histogram.counts() == {("cpu", "fb_twice", "fast", "degraded"): 3}
    why = arb.reasons[("cpu", "fb_twice", "fast", "degraded")]
    assert f"sized_slow ran instead, {slowdown[1]:.3g}x slower when measured" in why, why


def small_only(x: Any) -> Any:
    time.sleep(0.0003)
    return x * 2


def test_a_dispatch_that_fell_to_the_reference_is_the_worst_reason() -> None:
    """The winner declines everywhere: on the large key nothing else can run (the
    reference does), on the small one small_only serves, measured slower. The reason
    kept is the reference's, dispatched first or last."""
    small, large = np.arange(64.0), np.arange(4096.0)
    reg, ops = setup("fb_twice", (fast, "fast", None),
                     (small_only, "small_only", lambda x: x.size < 1000))
    cache = MeasureCache()
    tuner = Arbiter(registry=reg, ops=ops, cache=cache, mode="tune", policy=POLICY)
    tuner.dispatch("fb_twice", small)
    tuner.dispatch("fb_twice", large)
    assert [e.winner for e in cache.entries()] == ["fast", "fast"]
    WORKS["fast"] = False
    for order in ((large, small), (small, large)):
        arb = Arbiter(registry=reg, ops=ops, cache=cache, mode="static")
        for x in order:
            arb.dispatch("fb_twice", x)
        why = arb.reasons[("cpu", "fb_twice", "fast", "degraded")]
        assert "small_only ran instead" not in why, why


def test_what_ran_and_why_the_winner_did_not_are_noted_together() -> None:
    """A key's event tells its last dispatch: once the winner serves again (another
    shape of the key), the degrade of the signature before is not still shown beside
    it."""
    x = np.arange(64.0)
    cache = tuned("fb_twice", (x,), (fast, "fast", None), (slow, "slow", None))
    only_64 = {"fast": lambda v: v.shape[0] != 64}  # declines its measured shape now
    arb = replay("fb_twice", (x,), cache, (fast, "fast", only_64["fast"]),
                 (slow, "slow", None), times=1)
    (event,) = arb.events.values()
    assert (event.ran, event.winner_out) == ("slow", "degraded") and event.fallback
    arb.dispatch("fb_twice", np.arange(48.0))  # the same key: the winner runs it
    assert arb.histogram.counts()[("cpu", "fb_twice", "fast", "won")] == 1
    (event,) = arb.events.values()
    assert (event.ran, event.fallback, event.winner_out) == ("fast", "", "")


@pytest.mark.parametrize("ratio", [1.0099, 1.00994, 1.00996, 1.01, 1.01004, 1.0101])
def test_the_tie_rule_and_as_fast_judge_the_same_stored_ratio(ratio: float) -> None:
    """A ratio the comparison counts within the tie margin serves as fast, and one it
    does not is a degrade: both read the ratio as the entry stores it (1.00996 is stored
    as 1.01, outside a 1% margin: not a tie, and a degrade)."""
    from pytest_arbiter.decision.plans import Fallback
    from pytest_arbiter.timing.pairing import stored_ratio

    margin = ComparePolicy().tie_margin
    tied = stored_ratio(ratio) - 1.0 < margin  # the comparison's own test
    fallback = Fallback("w", "unavailable: x", (), {"r": stored_ratio(ratio)})
    assert fallback.worse("r") is not tied


def test_a_carried_row_has_no_slowdown_in_the_explanation() -> None:
    """A row carried from an older comparison was not timed beside the winner: show
    prints no ratio for it, and neither does the event --arbiter-explain prints (it
    had said "slower by" its medians over the winner's, from two different runs)."""
    x = np.arange(64.0)
    cache = tuned("fb_twice", (x,), (fast, "fast", None), (slow, "slow", None))
    (entry,) = cache.entries()
    carried = msgspec.structs.replace(entry.ranking[1], carried=True, ratio=None)
    cache = MeasureCache()
    cache.put(msgspec.structs.replace(entry, ranking=(entry.ranking[0], carried)))
    arb = replay("fb_twice", (x,), cache, (fast, "fast", None), (slow, "slow", None),
                 times=1)
    (event,) = arb.events.values()
    assert "slow" not in event.ratios and event.ratios["fast"] == 1.0
