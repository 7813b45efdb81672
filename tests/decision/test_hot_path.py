"""Correctness of the performance work: the hot path, the tuner's rules, idle plugin hooks.

No timing thresholds here: timers are scripted, so every assertion is deterministic.
The figures themselves live in ``bench/run_all.py`` and ``docs/performance.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import pytest

from pytest_arbiter import Arbiter, ComparePolicy, Decline, MeasureCache, measured_arbitrate
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.regions import MatmulRegion
from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.gating.histogram import DispatchHistogram
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats, compare_latencies

STATIC = "static"


class ScriptedTimer:
    """Returns a fixed time per candidate: whichever ran last inside ``sample``."""

    def __init__(self, times: Mapping[str, float]) -> None:
        self.times = dict(times)
        self.last = ""
        self.calls = 0

    def sample(self, fn: Callable[[], object]) -> float:
        fn()
        self.calls += 1
        return self.times[self.last]


def scripted(timer: ScriptedTimer, names: list[str]) -> dict[str, Callable[[], object]]:
    def make(name: str) -> Callable[[], object]:
        def run() -> None:
            timer.last = name

        return run

    return {n: make(n) for n in names}


def mats(m: int = 16, n: int = 16, k: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(m + n + k)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def fn_cand(fn: Callable[..., object], name: str, tier: int = 0,
            accepts: Callable[..., bool] | None = None, target: str = "cpu"
            ) -> FunctionCandidate:
    return FunctionCandidate(fn, name, "matmul", target, tier, accepts, None)


def library(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.matmul(a, b)
    return out


# -- the hot path -------------------------------------------------------------------------


def test_hot_path_records_each_outcome_on_repeat_dispatches() -> None:
    """The memoised path still counts won; a decline or a raise hands the work on."""
    mode = {"decline": False, "raise": False}

    def flaky(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if mode["decline"]:
            raise Decline("not today")
        if mode["raise"]:
            raise RuntimeError("boom")
        return library(a, b)

    reg = CandidateRegistry()
    reg.extend([fn_cand(flaky, "flaky", tier=2), fn_cand(library, "library")])
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    for _ in range(3):
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    mode["decline"] = True
    np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    mode["decline"], mode["raise"] = False, True
    np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    counts = arb.histogram.counts()
    assert counts == {("cpu", "matmul", "flaky", "won"): 3,
                      ("cpu", "matmul", "flaky", "error"): 1,
                      # the next candidate ran after the decline and after the error
                      ("cpu", "matmul", "library", "won"): 2}
    assert "RuntimeError: boom" in arb.errors[("cpu", "matmul", "flaky")]


def test_hot_path_records_a_decline_nobody_else_can_take_as_degraded() -> None:
    reg = CandidateRegistry()
    reg.add(fn_cand(library, "never", accepts=lambda a, b: False))
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    for _ in range(2):
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "matmul", "never", "degraded"): 2}
    assert arb.declines[("cpu", "matmul", "never")] == (
        "declined the inputs (accepts() returned False)")


def test_hot_path_records_no_candidate() -> None:
    reg = CandidateRegistry()
    reg.add(fn_cand(library, "elsewhere", target="amd"))
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    for _ in range(2):
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "matmul", "none", "no_candidate"): 2}


def test_memoised_plan_rechecks_accepts_for_same_signature() -> None:
    """Same shape and dtype, but a strided view the winner cannot run: the next one runs."""
    reg = CandidateRegistry()
    reg.extend([fn_cand(library, "contiguous_only", tier=5,
                        accepts=lambda a, b: bool(a.flags.c_contiguous)),
                fn_cand(library, "library")])
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    strided = np.asarray(np.random.default_rng(3).standard_normal((16, 32)), np.float32)[:, ::2]
    assert strided.shape == a.shape and not strided.flags.c_contiguous
    arb.dispatch("matmul", a, b)
    np.testing.assert_allclose(arb.dispatch("matmul", strided, b), strided @ b, rtol=1e-5)
    arb.dispatch("matmul", a, b)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "contiguous_only", "won")] == 2
    assert counts[("cpu", "matmul", "library", "won")] == 1
    assert not any(k[3] in ("degraded", "no_candidate") for k in counts)


def test_memoised_plan_is_dropped_when_the_registry_changes() -> None:
    reg = CandidateRegistry()
    reg.add(fn_cand(library, "library"))
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    arb.dispatch("matmul", a, b)
    reg.add(fn_cand(library, "newcomer", tier=9))
    arb.dispatch("matmul", a, b)
    reg.remove("newcomer")
    arb.dispatch("matmul", a, b)
    assert arb.histogram.counts() == {("cpu", "matmul", "library", "won"): 2,
                                      ("cpu", "matmul", "newcomer", "won"): 1}


def test_memoised_plan_is_dropped_when_the_cache_changes() -> None:
    """A cache update (a merged corpus, another worker) re-plans the next dispatch."""
    reg = CandidateRegistry()
    reg.extend([fn_cand(library, "high", tier=3), fn_cand(library, "low")])
    cache = MeasureCache()
    arb = Arbiter(registry=reg, cache=cache, mode=STATIC)
    a, b = mats()
    arb.dispatch("matmul", a, b)
    region = MatmulRegion.of(16, 16, 16, "float32")
    stats = LatencyStats(1.0, 1.0, 1.0, 1.0, 1.0, 3)
    cache.put(CacheEntry(cpu_device().tag, "cpu", "matmul", region.bucket(), "float32",
                         (RankedCandidate("low", stats), RankedCandidate("high", stats))))
    arb.dispatch("matmul", a, b)
    assert arb.histogram.counts() == {("cpu", "matmul", "high", "won"): 1,
                                      ("cpu", "matmul", "low", "won"): 1}


def test_histogram_counter_is_shared_by_the_hot_path_and_clear() -> None:
    hist = DispatchHistogram()
    reg = CandidateRegistry()
    reg.add(fn_cand(library, "library"))
    arb = Arbiter(registry=reg, histogram=hist, mode=STATIC)
    a, b = mats()
    arb.dispatch("matmul", a, b)
    hist.clear()
    arb.dispatch("matmul", a, b)
    arb.dispatch("matmul", a, b)
    assert hist.counts() == {("cpu", "matmul", "library", "won"): 2}


# -- the tuner ------------------------------------------------------------------------------


def test_clear_winner_stops_early_with_high_confidence() -> None:
    timer = ScriptedTimer({"fast": 100.0, "slow": 105.0})
    policy = ComparePolicy(min_rounds=7, max_rounds=200, budget_s=10.0, alpha=1e-3)
    comp = compare_latencies(scripted(timer, ["slow", "fast"]), tiers={"slow": 1, "fast": 0},
                             policy=policy, timer=timer)
    assert comp.ranking == ["fast", "slow"]
    assert not comp.tie
    assert comp.rounds == 10  # 2**-10 < 1e-3: the sign test's first chance to stop
    assert comp.confidence == pytest.approx(1.0 - 2.0**-10)
    assert comp.ratios["slow"] == pytest.approx(1.05)
    assert comp.timed_ns == pytest.approx(10 * 205.0)


def test_difference_inside_the_noise_is_a_tie_won_by_the_higher_tier() -> None:
    timer = ScriptedTimer({"fast": 100.0, "tiered": 100.0})
    policy = ComparePolicy(min_rounds=5, max_rounds=12, budget_s=10.0)
    comp = compare_latencies(scripted(timer, ["fast", "tiered"]),
                             tiers={"fast": 0, "tiered": 2}, policy=policy, timer=timer)
    assert comp.tie
    assert comp.ranking[0] == "tiered"
    assert comp.rounds == 12  # equal times never win a round: no early stop
    assert comp.confidence == pytest.approx(0.0)


def test_small_but_significant_difference_is_not_a_tie() -> None:
    """Significant at tie_alpha: the measured leader wins although another is tiered higher."""
    timer = ScriptedTimer({"fast": 100.0, "tiered": 100.5})
    policy = ComparePolicy(min_rounds=5, max_rounds=8, budget_s=10.0, tie_margin=0.01)
    comp = compare_latencies(scripted(timer, ["tiered", "fast"]),
                             tiers={"fast": 0, "tiered": 2}, policy=policy, timer=timer)
    assert not comp.tie
    assert comp.ranking[0] == "fast"


def test_the_cap_stops_before_a_round_would_overrun_it() -> None:
    """Each round claims 2 ms; a tie never gets confident, so only the 10 ms cap ends it."""
    timer = ScriptedTimer({"a": 1e6, "b": 1e6})
    policy = ComparePolicy(min_rounds=3, max_rounds=100, budget_s=0.001, cap_s=0.01)
    comp = compare_latencies(scripted(timer, ["a", "b"]), policy=policy, timer=timer)
    assert 1 <= comp.rounds < 100
    assert comp.timed_ns <= policy.cap_s * 1e9
    assert comp.spent_ns > 0


def test_the_soft_budget_stops_a_clear_pick_once_it_is_confident() -> None:
    """Rounds of 3 ms past a 1 ms budget: a 2x gap stops when the sign test first reaches
    the confidence target (7 rounds), not before and not at the cap."""
    timer = ScriptedTimer({"a": 1e6, "b": 2e6})
    policy = ComparePolicy(min_rounds=3, max_rounds=100, budget_s=0.001, cap_s=10.0,
                           alpha=1e-9)
    comp = compare_latencies(scripted(timer, ["a", "b"]), policy=policy, timer=timer)
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
    comp = compare_latencies(scripted(timer, ["a", "b"]), policy=policy, timer=timer)
    assert comp.ranking[0] == "a"
    assert 1.0 < comp.ratios["b"]


def test_measured_pick_records_confidence_and_tie_in_the_cache_entry() -> None:
    timer = ScriptedTimer({"fast": 100.0, "slow": 130.0, "same": 100.0})

    def kernel(name: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            timer.last = name
            return library(a, b)

        return run

    policy = ComparePolicy(min_rounds=5, max_rounds=12, budget_s=10.0)
    a, b = mats()
    cache = MeasureCache()
    sel = measured_arbitrate("matmul", (a, b), [fn_cand(kernel("slow"), "slow", tier=3),
                                                fn_cand(kernel("fast"), "fast")],
                             cache, timer=timer, policy=policy)
    assert sel.candidate is not None and sel.candidate.name == "fast"
    assert sel.entry is not None and not sel.entry.tie
    assert sel.entry.confidence == pytest.approx(1.0 - 2.0**-10)
    assert sel.entry.provenance.spent_ns > 0

    cache = MeasureCache()
    sel = measured_arbitrate("matmul", (a, b), [fn_cand(kernel("same"), "same", tier=3),
                                                fn_cand(kernel("fast"), "fast")],
                             cache, timer=timer, policy=policy)
    assert sel.candidate is not None and sel.candidate.name == "same"  # tie: higher tier
    assert sel.entry is not None and sel.entry.tie and sel.entry.confidence < 0.5


def test_gc_is_restored_after_a_comparison() -> None:
    import gc

    timer = ScriptedTimer({"a": 1.0, "b": 2.0})
    assert gc.isenabled()
    compare_latencies(scripted(timer, ["a", "b"]), timer=timer)
    assert gc.isenabled()

    def boom() -> None:
        raise RuntimeError("kernel failed while timed")

    failed = compare_latencies({"a": boom, "b": boom}, timer=timer)
    assert failed.ranking == [] and set(failed.failed) == {"a", "b"}
    assert gc.isenabled()


# -- the plugin when idle -------------------------------------------------------------------


def test_idle_tests_get_no_arbiter_bookkeeping(pytester: pytest.Pytester) -> None:
    """A test is tracked only once something dispatched; a fixture's teardown counts."""
    pytester.makepyfile(
        """
        import numpy as np
        import pytest

        @pytest.fixture
        def dispatch_on_teardown(arbiter):
            yield
            a = np.ones((4, 4), np.float32)
            arbiter.dispatch("matmul", a, a)

        def test_hooks(request):
            session = request.config.pluginmanager.get_plugin("arbiter-session")
            assert session._arbiter is None  # nothing dispatched yet: no bookkeeping
            assert not request.config.pluginmanager.has_plugin("arbiter-no-skip")

        def test_idle():
            pass

        def test_busy(arbiter, dispatch_on_teardown):
            a = np.ones((4, 4), np.float32)
            arbiter.dispatch("matmul", a, a)

        """)
    result = pytester.runpytest("--junitxml=out.xml")
    result.assert_outcomes(passed=3)
    xml = (pytester.path / "out.xml").read_text()
    busy = xml[xml.index('name="test_busy"'):]
    busy = busy[:busy.index("</testcase>")]
    assert 'value="2"' in busy and "arbiter:cpu/matmul/" in busy
    idle = xml[xml.index('name="test_idle"'):]
    idle = idle[:idle.index("/>") + 2]
    assert "arbiter:" not in idle


def test_cache_hit_keeps_the_measured_order_not_the_tier_order() -> None:
    """A cached ranking is followed as measured; tiers only order what was not measured."""
    reg = CandidateRegistry()
    reg.extend([fn_cand(library, "high", tier=3), fn_cand(library, "low")])
    a, b = mats(32, 32, 32)
    region = MatmulRegion.of(32, 32, 32, "float32")
    stats = LatencyStats(1.0, 1.0, 1.0, 1.0, 1.0, 3)
    cache = MeasureCache([CacheEntry(cpu_device().tag, "cpu", "matmul", region.bucket(),
                                     "float32", (RankedCandidate("low", stats),
                                                 RankedCandidate("high", stats)))])
    timer = ScriptedTimer({})
    sel = measured_arbitrate("matmul", (a, b), reg.for_op("matmul"), cache, timer=timer)
    assert sel.source == "cached" and timer.calls == 0
    assert [c.name for c in sel.order] == ["low", "high"]
    for mode in ("tune", "static", "strict"):
        arb = Arbiter(registry=reg, cache=cache, mode=mode)
        arb.dispatch("matmul", a, b)
        assert arb.histogram.counts() == {("cpu", "matmul", "low", "won"): 1}, mode


def test_memoised_plans_stay_bounded_and_dispatch_keeps_working(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_arbiter.decision import arbiter as arbiter_module, plans

    monkeypatch.setattr(plans, "MAX_PLANS", 8)
    arb = arbiter_module.Arbiter(mode="static")
    for n in range(1, 30):
        out = arb.dispatch("softmax", np.zeros((2, n), np.float32))
        np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-6)
        assert len(arb.plans.young("static")) <= 8
    assert sum(arb.histogram.counts().values()) == 29
