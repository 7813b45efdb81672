"""Correctness of the performance work: the hot path, the tuner's rules, idle plugin hooks.

No timing thresholds here: timers are scripted, so every assertion is deterministic.
The figures themselves live in ``bench/run_all.py`` and ``docs/performance.md``.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_arbiter import Arbiter, Decline, MeasureCache, measured_arbitrate
from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.core.regions import MatmulRegion
from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.gating.histogram import DispatchHistogram
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats
from tests.factories import ScriptedTimer, fn, library, mats

STATIC = "static"


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
    reg.extend([fn(flaky, "flaky", tier=2), fn(library, "library")])
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
    reg.add(fn(library, "never", accepts=lambda a, b: False))
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    for _ in range(2):
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "matmul", "never", "degraded"): 2}
    assert arb.declines[("cpu", "matmul", "never")] == (
        "declined the inputs (accepts() returned False)")


def test_hot_path_records_no_candidate() -> None:
    reg = CandidateRegistry()
    reg.add(fn(library, "elsewhere", target="amd"))
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    for _ in range(2):
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "matmul", "none", "no_candidate"): 2}


def test_memoised_plan_rechecks_accepts_for_same_signature() -> None:
    """Same shape and dtype, but a strided view the winner cannot run: the next one runs."""
    reg = CandidateRegistry()
    reg.extend([fn(library, "contiguous_only", tier=5,
                        accepts=lambda a, b: bool(a.flags.c_contiguous)),
                fn(library, "library")])
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
    reg.add(fn(library, "library"))
    arb = Arbiter(registry=reg, mode=STATIC)
    a, b = mats()
    arb.dispatch("matmul", a, b)
    reg.add(fn(library, "newcomer", tier=9))
    arb.dispatch("matmul", a, b)
    reg.remove("newcomer")
    arb.dispatch("matmul", a, b)
    assert arb.histogram.counts() == {("cpu", "matmul", "library", "won"): 2,
                                      ("cpu", "matmul", "newcomer", "won"): 1}


def test_memoised_plan_is_dropped_when_the_cache_changes() -> None:
    """A cache update (a merged corpus, another worker) re-plans the next dispatch."""
    reg = CandidateRegistry()
    reg.extend([fn(library, "high", tier=3), fn(library, "low")])
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
    reg.add(fn(library, "library"))
    arb = Arbiter(registry=reg, histogram=hist, mode=STATIC)
    a, b = mats()
    arb.dispatch("matmul", a, b)
    hist.clear()
    arb.dispatch("matmul", a, b)
    arb.dispatch("matmul", a, b)
    assert hist.counts() == {("cpu", "matmul", "library", "won"): 2}


def test_cache_hit_keeps_the_measured_order_not_the_tier_order() -> None:
    """A cached ranking is followed as measured; tiers only order what was not measured."""
    reg = CandidateRegistry()
    reg.extend([fn(library, "high", tier=3), fn(library, "low")])
    a, b = mats(32, 32, 32)
    region = MatmulRegion.of(32, 32, 32, "float32")
    stats = LatencyStats(1.0, 1.0, 1.0, 1.0, 1.0, 3)
    cache = MeasureCache([CacheEntry(cpu_device().tag, "cpu", "matmul", region.bucket(),
                                     "float32", (RankedCandidate("low", stats),
                                                 RankedCandidate("high", stats)))])
    timer = ScriptedTimer({})
    sel = measured_arbitrate("matmul", (a, b), reg.for_op("matmul"), cache, timer=timer)
    assert sel.source == "cached" and timer.samples == 0
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
