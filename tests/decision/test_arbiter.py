"""Arbitration: static and measured picks, the cache, outcomes, and the two origin bugs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import numpy as np
import pytest

from pytest_arbiter import (
    Arbiter,
    CacheMiss,
    ComparePolicy,
    Decline,
    MatmulRegion,
    MeasureCache,
    arbitrate,
    measure_latency,
    measured_arbitrate,
)
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate, candidate
from pytest_arbiter.core.ops import OPS
from pytest_arbiter.core.regions import bucket_dims
from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import CPU_TIMER, LatencyStats
from tests.factories import FAST, ScriptedTimer, fn, library, mats, registry_of


class CountingTimer:
    def __init__(self) -> None:
        self.calls = 0

    def sample(self, fn: Callable[[], object]) -> float:
        self.calls += 1
        return CPU_TIMER.sample(fn)


def aligned(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape[0] % 16 == 0 and b.shape[1] % 8 == 0 and a.shape[1] % 16 == 0


def make_registry(*extra: FunctionCandidate) -> CandidateRegistry:
    return registry_of(fn(library, "library"), *extra)


def rowwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.stack([row @ b for row in a])


def test_origin_ragged_case_is_won_by_the_other_candidate() -> None:
    """SPEC bug 1: tune 32x16x32 with an aligned-only winner, dispatch 24x16x32."""
    fast_aligned = FunctionCandidate(lambda a, b: np.dot(a, b), "aligned_only", "matmul",
                                     "cpu", 5, aligned, None)
    # the general candidate multiplies row by row: a real gap, so the aligned-only one wins
    # the tuned shape on any machine (np.dot against np.matmul is a tie that either wins)
    reg = CandidateRegistry()
    reg.add(FunctionCandidate(rowwise, "library", "matmul", "cpu", 0, None, None))
    reg.add(fast_aligned)
    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    arb.dispatch("matmul", *mats(32, 16, 32))
    arb.dispatch("matmul", *mats(24, 16, 32))
    counts = arb.histogram.counts()
    assert not any(k[3] == "degraded" for k in counts), counts
    assert counts[("cpu", "matmul", "library", "won")] == 1
    assert sum(counts.values()) == 2


def test_cache_hit_rechecks_accepts_and_falls_to_next_ranked() -> None:
    """A hit whose winner cannot run the inputs (here: strides) uses the next-fastest."""
    contiguous_only = FunctionCandidate(lambda a, b: np.dot(a, b), "contiguous_only", "matmul",
                                        "cpu", 5, lambda a, b: a.flags.c_contiguous, None)
    reg = make_registry(contiguous_only)
    cache = MeasureCache()
    a, b = mats(32, 32, 32)
    timer = CountingTimer()
    first = measured_arbitrate(OPS.get("matmul"), (a, b), reg.for_op("matmul"), cache,
                               timer=timer, policy=FAST)
    assert first.source == "measured" and timer.calls > 0
    entry = cache.entries()[0]
    assert {r.name for r in entry.ranking} == {"library", "contiguous_only"}
    # force the aligned kernel to be the winner, then query with a transposed view
    ranking = sorted(entry.ranking, key=lambda r: r.name != "contiguous_only")
    cache.put(type(entry)(entry.device, entry.target, entry.op, entry.bucket, entry.dtype,
                          tuple(ranking)))
    before = timer.calls
    hit = measured_arbitrate(OPS.get("matmul"), (np.asfortranarray(a), b), reg.for_op("matmul"),
                             cache, timer=timer, policy=FAST)
    assert hit.source == "cached"
    assert hit.candidate is not None and hit.candidate.name == "library"
    assert timer.calls == before, "a cache hit must time nothing"


def test_repeat_query_in_the_same_bucket_times_nothing() -> None:
    # one candidate: its pick is never low-confidence (which a tune measures again),
    # however loaded the machine is while it is timed
    reg = registry_of(FunctionCandidate(np.dot, "dot", "matmul", "cpu", 0, None, None))
    cache, timer = MeasureCache(), CountingTimer()
    measured_arbitrate("matmul", mats(30, 20, 10), reg.for_op("matmul"), cache, timer=timer,
                       policy=FAST)
    calls = timer.calls
    assert calls > 0 and len(cache) == 1
    again = measured_arbitrate("matmul", mats(30, 28, 10), reg.for_op("matmul"), cache,
                               timer=timer, policy=FAST)
    assert again.source == "cached" and timer.calls == calls


def test_buckets_group_powers_of_two_and_separate_alignment() -> None:
    assert bucket_dims((30, 20, 10)) == bucket_dims((30, 28, 10))
    assert MatmulRegion.of(32, 16, 32, "float32").bucket() == "32x16x32/a16.16.16"
    assert MatmulRegion.of(24, 16, 32, "float32").bucket() == "32x16x32/a8.16.16"
    assert MatmulRegion.of(100, 1, 3, "float16").bucket() == "128x1x4/a4.1.1"


def test_fast_but_wrong_candidate_never_wins() -> None:
    wrong = FunctionCandidate(lambda a, b: np.zeros((a.shape[0], b.shape[1]), a.dtype),
                              "fast_wrong", "matmul", "cpu", 9, None, None)
    reg = make_registry(wrong)
    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    a, b = mats(64, 64, 64)
    out = arb.dispatch("matmul", a, b)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    entry = arb.cache.entries()[0]
    assert entry.winner == "library"
    assert "fast_wrong" not in {r.name for r in entry.ranking}
    assert "F4 gate" in entry.rejected["fast_wrong"]
    event = next(iter(arb.events.values()))
    assert "failed the F4 gate" in event.passed_over["fast_wrong"]


def test_measured_pick_is_the_faster_candidate() -> None:
    def slow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        for _ in range(30):
            out = np.matmul(a, b)
        return out

    reg = CandidateRegistry()
    reg.add(FunctionCandidate(slow, "slow", "matmul", "cpu", 9, None, None))
    reg.add(FunctionCandidate(np.matmul, "quick", "matmul", "cpu", 0, None, None))
    cache = MeasureCache()
    sel = measured_arbitrate("matmul", mats(64, 64, 64), reg.for_op("matmul"), cache)
    assert sel.candidate is not None and sel.candidate.name == "quick"
    entry = cache.entries()[0]
    assert [r.name for r in entry.ranking] == ["quick", "slow"]
    assert entry.ranking[0].stats.median_ns < entry.ranking[1].stats.median_ns
    assert 0.0 <= entry.confidence <= 1.0 and not entry.tie
    assert entry.provenance.device_name == cpu_device().name


def test_entries_from_another_device_are_never_used() -> None:
    reg = make_registry(FunctionCandidate(np.dot, "dot", "matmul", "cpu", 0, None, None))
    cache = MeasureCache()
    measured_arbitrate("matmul", mats(16, 16, 16), reg.for_op("matmul"), cache, policy=FAST)
    entry = cache.entries()[0]
    foreign = type(entry)("cpu-other-machine", entry.target, entry.op, entry.bucket,
                          entry.dtype, entry.ranking)
    alien_only = MeasureCache([foreign])
    timer = CountingTimer()
    sel = measured_arbitrate("matmul", mats(16, 16, 16), reg.for_op("matmul"), alien_only,
                             timer=timer, policy=FAST)
    assert sel.source == "measured" and timer.calls > 0
    assert len(alien_only) == 2


@pytest.mark.parametrize("a_shape, b_shape, dtypes, needle", [
    ((4, 5), (6, 3), ("float32", "float32"), "A is 4x5 (K=5) but B is 6x3 (K=6)"),
    ((4, 5, 1), (5, 3), ("float32", "float32"), "A is 4x5x1, B is 5x3"),
    ((4, 5), (5, 3), ("float32", "float16"), "dtypes differ"),
])
def test_contraction_is_checked_before_any_candidate_runs(
        a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtypes: tuple[str, str],
        needle: str) -> None:
    ran: list[str] = []
    spy = FunctionCandidate(lambda a, b: ran.append("ran"), "spy", "matmul", "cpu", 9,
                            lambda a, b: ran.append("accepts") or True, None)
    arb = Arbiter(registry=make_registry(spy), mode="tune")
    a = np.ones(a_shape, dtype=dtypes[0])
    b = np.ones(b_shape, dtype=dtypes[1])
    with pytest.raises(ValueError, match="matmul") as info:
        arb.dispatch("matmul", a, b)
    assert needle in str(info.value)
    assert ran == [] and len(arb.cache) == 0 and len(arb.histogram) == 0


def test_each_outcome_is_recorded() -> None:
    calls = {"n": 0}

    def flaky(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        raise RuntimeError("boom")

    def declines(x: np.ndarray) -> np.ndarray:
        raise Decline("tile too small")

    reg = CandidateRegistry()
    reg.add(FunctionCandidate(flaky, "flaky", "matmul", "cpu", 3, None, None))
    reg.add(FunctionCandidate(np.matmul, "library", "matmul", "cpu", 1, None, None))
    reg.add(FunctionCandidate(declines, "decliner", "softmax", "cpu", 1, None, None))
    arb = Arbiter(registry=reg, mode="static")
    a, b = mats(8, 8, 8)
    np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    x = np.random.default_rng(0).standard_normal((3, 9)).astype(np.float32)
    out = arb.dispatch("softmax", x)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-5)
    arb.dispatch("matmul", *mats(8, 8, 8), target="amd")
    counts = arb.histogram.counts()
    assert counts == {
        ("cpu", "matmul", "flaky", "error"): 1,
        ("cpu", "matmul", "library", "won"): 1,
        ("cpu", "softmax", "decliner", "degraded"): 1,
        ("amd", "matmul", "none", "no_candidate"): 1,
    }
    assert arb.declines[("cpu", "softmax", "decliner")] == "tile too small"
    assert "boom" in arb.errors[("cpu", "matmul", "flaky")]
    assert arb.histogram.counts(target="cpu", op="matmul") == {
        ("cpu", "matmul", "flaky", "error"): 1, ("cpu", "matmul", "library", "won"): 1}
    assert set(arb.histogram.counts(op="softmax")) == {("cpu", "softmax", "decliner", "degraded")}


def test_static_arbitrate_prefers_higher_tier_that_accepts() -> None:
    reg = make_registry(
        FunctionCandidate(np.dot, "high", "matmul", "cpu", 7, aligned, None),
        FunctionCandidate(np.dot, "gone", "matmul", "cpu", 9, None, lambda: "no such unit"),
    )
    region = MatmulRegion.of(24, 16, 32, "float32")
    sel = arbitrate(region, reg.for_op("matmul"), mats(24, 16, 32))
    assert sel.candidate is not None and sel.candidate.name == "library"
    assert sel.passed_over["gone"] == "unavailable: no such unit"
    assert "declined the inputs" in sel.passed_over["high"]
    aligned_sel = arbitrate(MatmulRegion.of(32, 16, 32, "float32"), reg.for_op("matmul"),
                            mats(32, 16, 32))
    assert aligned_sel.candidate is not None and aligned_sel.candidate.name == "high"


def test_strict_mode_makes_a_miss_an_error() -> None:
    arb = Arbiter(registry=make_registry(), mode="strict")
    with pytest.raises(CacheMiss, match="strict mode"):
        arb.dispatch("matmul", *mats(8, 8, 8))


def test_measure_latency_keeps_the_spread() -> None:
    stats = measure_latency(np.matmul, np.ones((32, 32)), np.ones((32, 32)), warmup=2, repeat=9)
    assert stats.samples == 9
    assert stats.min_ns <= stats.q1_ns <= stats.median_ns <= stats.q3_ns <= stats.max_ns
    assert LatencyStats.from_dict(stats.to_dict()) == stats
    with pytest.raises(ValueError):
        measure_latency(np.matmul, repeat=0)


def test_decorator_registers_and_user_op_dispatches() -> None:
    import pytest_arbiter

    reg = CandidateRegistry()

    @pytest_arbiter.op("scale2_test_op")
    def scale2(x: np.ndarray) -> np.ndarray:
        return x * 2

    @candidate("scale2_test_op", target="cpu", tier=1, registry=reg)
    def scale2_fast(x: np.ndarray) -> np.ndarray:
        return x + x

    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    x = np.arange(10, dtype=np.float32)
    np.testing.assert_array_equal(arb.dispatch("scale2_test_op", x), x * 2)
    assert arb.histogram.counts() == {("cpu", "scale2_test_op", "scale2_fast", "won"): 1}
    with pytest.raises(ValueError, match="already registered"):
        reg.add(FunctionCandidate(np.add, "scale2_fast", "matmul", "cpu", 0, None, None))


def _fresh_python(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def test_import_and_dispatch_leave_pytest_and_cupy_out() -> None:
    code = ("import sys, numpy as np, pytest_arbiter; "
            "arb = pytest_arbiter.Arbiter(mode='static'); "
            "arb.dispatch('matmul', np.ones((4, 4)), np.ones((4, 4))); "
            "arb.dispatch('matmul', np.ones((4, 4)), np.ones((4, 4)), target='nvidia'); "
            "print(sorted(m for m in ('pytest', 'cupy', '_pytest') if m in sys.modules), "
            "sorted(k[3] for k in arb.histogram.counts()))")
    assert _fresh_python(code) == "[] ['no_candidate', 'won']"


def test_loading_the_plugin_imports_neither_numpy_nor_the_kernels() -> None:
    """Nor the artifacts' codecs (msgspec) and locks (filelock): a run that reads no
    baseline and writes nothing pays for none of them."""
    code = ("import sys, pytest_arbiter.plugin; "
            "print(sorted(m for m in ('numpy', 'msgspec', 'filelock', 'pytest_arbiter.runtime', "
            "'pytest_arbiter.decision.arbiter') if m in sys.modules))")
    assert _fresh_python(code) == "[]"


def test_the_registry_loads_the_bundled_kernels_on_first_read() -> None:
    code = ("import sys; from pytest_arbiter.core.candidates import REGISTRY; "
            "before = 'pytest_arbiter.runtime' in sys.modules; "
            "names = {c.name for c in REGISTRY.for_op('matmul', 'cpu')}; "
            "print(before, sorted(names))")
    assert _fresh_python(code) == "False ['blas_matmul', 'dot_matmul', 'panel_matmul']"
    # the GPU lanes' device probes come with them: no "no probe registered" here
    code = ("from pytest_arbiter.extend.device import probe_device; "
            "print('no device probe is registered' in str(probe_device('nvidia')))")
    assert _fresh_python(code) == "False"


def test_tune_records_a_gated_outcome_when_every_candidate_that_could_run_fails() -> None:
    def declines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise Decline("tile too small")

    def wrong(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.zeros((a.shape[0], b.shape[1]), a.dtype)

    for kernel, name, outcome, reason in ((declines, "decliner", "degraded", "tile too small"),
                                          (wrong, "wrong", "rejected", "all zeros")):
        reg = CandidateRegistry()
        reg.add(FunctionCandidate(kernel, name, "matmul", "cpu", 5, None, None))
        reg.add(FunctionCandidate(np.matmul, "other_lane", "matmul", "nvidia", 1, None, None))
        arb = Arbiter(registry=reg, mode="tune", policy=FAST)
        a, b = mats(8, 8, 8)
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
        arb.dispatch("matmul", a, b)
        # the reference ran in place of a candidate that declined (degraded) or was
        # wrong (rejected): both are gated outcomes, with the reason
        assert arb.histogram.counts() == {("cpu", "matmul", name, outcome): 2}
        assert reason in arb.reasons[("cpu", "matmul", name, outcome)]
        assert len(arb.cache) == 0
    # nothing that applies at all is still no_candidate
    arb = Arbiter(registry=CandidateRegistry(), mode="tune", policy=FAST)
    arb.dispatch("matmul", *mats(8, 8, 8))
    assert arb.histogram.counts() == {("cpu", "matmul", "none", "no_candidate"): 1}


def test_other_strides_use_the_cached_ranking_without_measuring_again() -> None:
    def c_only(a: np.ndarray, b: np.ndarray) -> bool:
        return bool(a.flags.c_contiguous)

    def f_only(a: np.ndarray, b: np.ndarray) -> bool:
        return bool(a.flags.f_contiguous and not a.flags.c_contiguous)

    reg = CandidateRegistry()
    reg.add(FunctionCandidate(np.matmul, "x_c", "matmul", "cpu", 0, c_only, None))
    reg.add(FunctionCandidate(np.dot, "z_f", "matmul", "cpu", 0, f_only, None))
    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    a, b = mats(32, 16, 32)
    region = MatmulRegion.of(32, 16, 32, "float32")
    stats = LatencyStats(1000.0, 900.0, 950.0, 1050.0, 1100.0, 9)
    seeded = CacheEntry(cpu_device().tag, "cpu", "matmul", region.bucket(), "float32",
                        (RankedCandidate("x_c", stats), RankedCandidate("z_f", stats)))
    arb.cache.put(seeded)
    arb.dispatch("matmul", a, b)
    arb.dispatch("matmul", np.asfortranarray(a), b)  # same signature, other strides
    assert arb.histogram.counts() == {("cpu", "matmul", "x_c", "won"): 1,
                                      ("cpu", "matmul", "z_f", "won"): 1}
    assert arb.cache.get(seeded.key) is seeded  # nothing measured, nothing rewritten


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
    sel = measured_arbitrate("matmul", (a, b), [fn(kernel("slow"), "slow", tier=3),
                                                fn(kernel("fast"), "fast")],
                             cache, timer=timer, policy=policy)
    assert sel.candidate is not None and sel.candidate.name == "fast"
    assert sel.entry is not None and not sel.entry.tie
    assert sel.entry.confidence == pytest.approx(1.0 - 2.0**-10)
    assert sel.entry.provenance.spent_ns > 0

    cache = MeasureCache()
    sel = measured_arbitrate("matmul", (a, b), [fn(kernel("same"), "same", tier=3),
                                                fn(kernel("fast"), "fast")],
                             cache, timer=timer, policy=policy)
    assert sel.candidate is not None and sel.candidate.name == "same"  # tie: higher tier
    assert sel.entry is not None and sel.entry.tie and sel.entry.confidence < 0.5
