"""One gated arbiter: lead-safety in every mode, declines that fall through, errors that
are seen, keys that separate what a kernel can run, and the bounded plan table.

These drive :class:`Arbiter` directly (no pytest plugin); the plugin's wiring is in
tests/test_library_dispatch.py.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_arbiter import Arbiter, CacheMiss, ComparePolicy, Decline, MeasureCache
from pytest_arbiter.core.candidates import FunctionCandidate
from pytest_arbiter.core.ops import OpRegistry, make_op
from pytest_arbiter.decision import plans as plans_module
from tests.factories import FAST, fn, library, mats, registry_of


def zeros(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)


def scribbler(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.matmul(a, b)
    a[...] = 0  # writes into its input
    return out


@pytest.mark.parametrize("mode", ["static", "tune"])
def test_a_wrong_top_tier_kernel_never_runs_on_the_callers_data(mode: str) -> None:
    reg = registry_of(fn(zeros, "zeros", tier=5), fn(scribbler, "scribbler", tier=4),
                      fn(library, "library", tier=0))
    arb = Arbiter(registry=reg, mode=mode, policy=FAST)
    for _ in range(12):
        a, b = mats(16, 16, 16)
        keep = a.copy()
        out = arb.dispatch("matmul", a, b)
        np.testing.assert_array_equal(a, keep)  # nobody wrote into the caller's array
        np.testing.assert_allclose(out, keep @ b, rtol=1e-5)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "library", "won")] == 12
    # static: every dispatch reaches the two above the library; tune: the measuring
    # dispatch gated them, and the measured ranking never reaches them again
    reached = 12 if mode == "static" else 1
    assert counts[("cpu", "matmul", "zeros", "rejected")] == reached
    assert counts[("cpu", "matmul", "scribbler", "rejected")] == reached
    assert not any(k[2] in ("zeros", "scribbler") and k[3] == "won" for k in counts)
    assert "all zeros" in arb.reasons[("cpu", "matmul", "zeros", "rejected")]
    assert "modified its inputs" in arb.reasons[("cpu", "matmul", "scribbler", "rejected")]


def test_a_kernel_changed_after_tuning_is_gated_on_the_cache_hit() -> None:
    """The corpus names ``fast`` the winner; its body is now wrong: it never runs."""
    tuned = Arbiter(registry=registry_of(fn(library, "one"), fn(np.dot, "two")), mode="tune",
                    policy=FAST)
    tuned.dispatch("matmul", *mats(32, 32, 32))
    cache = tuned.cache
    (entry,) = cache.entries()
    winner = entry.winner
    other = "two" if winner == "one" else "one"
    # its code changed: the entry is not used, the tier order runs and reaches it first
    changed = registry_of(fn(zeros, winner, tier=1),
                          fn(library if other == "one" else np.dot, other))
    arb = Arbiter(registry=changed, cache=cache, mode="static")
    a, b = mats(32, 32, 32)
    np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "matmul", winner, "rejected"): 1,
                                      ("cpu", "matmul", other, "won"): 1}
    (event,) = arb.events.values()
    assert event.source == "static"
    assert event.stale == {"winner-changed": f"the cached winner {winner} changed code "
                                             "since it was measured"}


def test_gate_off_runs_ungated_only_what_the_corpus_vouches_for() -> None:
    """Production default: a candidate the key's corpus entry measured with its current
    code runs with no gate cost; anything else is gated before its first run."""
    no_corpus = Arbiter(registry=registry_of(fn(zeros, "zeros", tier=5), fn(library, "library")),
                        mode="static", gate=False)
    a, b = mats(8, 8, 8)
    np.testing.assert_allclose(no_corpus.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    assert no_corpus.histogram.counts() == {("cpu", "matmul", "zeros", "rejected"): 1,
                                            ("cpu", "matmul", "library", "won"): 1}

    calls: list[str] = []

    def counted(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        calls.append("measured code")
        return library(x, y)

    def edited(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        calls.append("edited code")
        return np.matmul(x, y)

    tuner = Arbiter(registry=registry_of(fn(counted, "library")), mode="tune", policy=FAST)
    tuner.dispatch("matmul", *mats(8, 8, 8))
    calls.clear()
    vouched = Arbiter(registry=registry_of(fn(counted, "library")), cache=tuner.cache,
                      mode="static", gate=False)
    vouched.dispatch("matmul", *mats(8, 8, 8))
    assert calls == ["measured code"]  # the dispatch itself, no gate call
    assert vouched.histogram.counts() == {("cpu", "matmul", "library", "won"): 1}
    calls.clear()
    gated = Arbiter(registry=registry_of(fn(edited, "library")), cache=tuner.cache,
                    mode="static", gate=False)
    gated.dispatch("matmul", *mats(8, 8, 8))
    assert len(calls) > 1  # its code is not what was measured: gated, then run


def test_decline_on_a_cache_hit_falls_to_the_cached_runner_up() -> None:
    reg = registry_of(fn(rowmajor, "rowmajor", tier=1), fn(slow_library, "slow_library"))
    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    a, b = mats(32, 32, 32)
    arb.dispatch("matmul", a, b)
    np.testing.assert_allclose(arb.dispatch("matmul", np.asfortranarray(a), b), a @ b,
                               rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "matmul", "rowmajor", "won"): 1,
                                      ("cpu", "matmul", "slow_library", "won"): 1}


def test_reference_runs_only_when_no_candidate_can_and_is_named_after_the_first() -> None:
    def first(x: np.ndarray) -> np.ndarray:
        raise Decline("tile too small")

    def second(x: np.ndarray) -> np.ndarray:
        raise Decline("no")

    reg = registry_of(fn(first, "first", "softmax", tier=2), fn(second, "second", "softmax"))
    arb = Arbiter(registry=reg, mode="static")
    x = np.random.default_rng(0).standard_normal((3, 9)).astype(np.float32)
    out = arb.dispatch("softmax", x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "softmax", "first", "degraded"): 1}
    assert arb.reasons[("cpu", "softmax", "first", "degraded")] == "tile too small"


def test_an_error_falls_through_and_is_recorded_with_its_message() -> None:
    armed = {"on": False}

    def workspace(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if armed["on"]:  # passed the gate and ran once; now it fails at dispatch
            raise MemoryError("workspace too small")
        return np.matmul(a, b)

    arb = Arbiter(registry=registry_of(fn(workspace, "workspace", tier=3), fn(library, "lib")),
                  mode="static")
    arb.dispatch("matmul", *mats(8, 8, 8))
    assert arb.histogram.counts() == {("cpu", "matmul", "workspace", "won"): 1}
    armed["on"] = True
    for _ in range(3):
        a, b = mats(8, 8, 8)
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "workspace", "error")] == 3
    assert counts[("cpu", "matmul", "lib", "won")] == 3
    assert arb.reasons[("cpu", "matmul", "workspace", "error")] == (
        "MemoryError: workspace too small")


@pytest.mark.parametrize("mode", ["static", "tune"])
def test_raising_accepts_and_available_never_reach_the_caller(mode: str) -> None:
    def bad_accepts(a: np.ndarray, b: np.ndarray) -> bool:
        raise KeyError("stride table")

    def bad_available() -> bool:
        raise OSError("driver gone")

    reg = registry_of(fn(library, "picky", tier=3, accepts=bad_accepts),
                      FunctionCandidate(library, "gone", "matmul", "cpu", 2, None, bad_available),
                      fn(np.dot, "dot"))
    arb = Arbiter(registry=reg, mode=mode, policy=FAST)
    for _ in range(2):
        a, b = mats(8, 8, 8)
        np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "dot", "won")] == 2
    # static: both dispatches reach them; tune: the measuring one did, and the measured
    # ranking (dot) serves the next one before reaching them
    reached = 2 if mode == "static" else 1
    assert counts[("cpu", "matmul", "picky", "error")] == reached
    assert counts[("cpu", "matmul", "gone", "error")] == reached
    assert "KeyError" in arb.reasons[("cpu", "matmul", "picky", "error")]
    assert "driver gone" in arb.reasons[("cpu", "matmul", "gone", "error")]


def test_a_raise_in_the_timed_rounds_is_an_error_not_an_escape() -> None:
    calls = {"n": 0}

    def late(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        if calls["n"] == 12:  # after the gate (5 trials) and the warmup
            raise RuntimeError("fifth round")
        return np.matmul(a, b)

    arb = Arbiter(registry=registry_of(fn(late, "late", tier=1), fn(np.dot, "dot")),
                  mode="tune", policy=ComparePolicy(min_rounds=9, max_rounds=20, budget_s=1.0))
    a, b = mats(16, 16, 16)
    np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "late", "error")] == 1
    assert counts[("cpu", "matmul", "dot", "won")] == 1
    assert "fifth round" in arb.reasons[("cpu", "matmul", "late", "error")]


def test_softmax_tuned_on_a_vector_is_not_served_to_a_row() -> None:
    def flat_only(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max())
        return (e / e.sum()).ravel()  # right for 1-D, wrong shape for (1, n)

    reg = registry_of(fn(flat_only, "flat_only", "softmax", tier=2),
                      fn(lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(
                       x - x.max(-1, keepdims=True)).sum(-1, keepdims=True), "rowwise",
                      "softmax"))
    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    x = np.random.default_rng(1).standard_normal(128).astype(np.float32)
    assert arb.dispatch("softmax", x).shape == (128,)
    row = arb.dispatch("softmax", x[None, :])
    assert row.shape == (1, 128)
    counts = arb.histogram.counts()
    assert ("cpu", "softmax", "flat_only", "rejected") in counts
    assert len({e.bucket for e in arb.events.values()}) == 2


def test_the_bucket_separates_a_declared_alignment_above_16() -> None:
    """A K%32 kernel: K=48 (16-aligned only) never shares a key with K=64."""
    k32 = FunctionCandidate(library, "k32", "matmul", "cpu", 5,
                            lambda a, b: a.shape[1] % 32 == 0, None)
    k32.align = (1, 1, 32)
    reg = registry_of(k32, fn(np.dot, "dot"))
    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    arb.dispatch("matmul", *mats(16, 16, 64))
    arb.dispatch("matmul", *mats(16, 16, 48))
    buckets = sorted(e.bucket for e in arb.events.values())
    assert buckets == ["16x16x64/a16.16.16", "16x16x64/a16.16.32"]
    counts = arb.histogram.counts()
    assert sum(counts.values()) == 2 and all(k[3] == "won" for k in counts), counts


def slow_library(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    time.sleep(0.002)  # far slower than any BLAS call here: the timing can't pick it first
    return np.matmul(a, b)


def odd_kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    time.sleep(0.0005)  # between the two, so every measured order is clear-cut
    return np.matmul(a, b)


def rowmajor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:
        raise Decline("needs a row-major A")
    return np.matmul(a, b)


def odd_rows(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape[0] % 2 == 1


LAYOUTS = [(32, False), (32, True), (24, False), (24, True), (25, False), (25, True)]


def layout_inputs(m: int, fortran: bool) -> tuple[np.ndarray, np.ndarray]:
    a, b = mats(m, 32, 32)
    return (np.asfortranarray(a) if fortran else a), b


@given(order=st.permutations(range(len(LAYOUTS))))
@settings(max_examples=15, deadline=None)
@pytest.mark.slow
def test_the_same_kernels_and_shapes_give_the_same_outcomes_in_any_order(
        order: list[int]) -> None:
    """A fast row-major-only kernel that declines by raising (the layout is not part of
    the key), an odd-rows kernel that declines through ``accepts``, and a slow library
    GEMM: each input gets the same candidate and outcome whatever came before it."""
    def outcomes(sequence: list[int], mode: str) -> dict[tuple[int, bool], str]:
        reg = registry_of(fn(rowmajor, "rowmajor", tier=1),
                          fn(odd_kernel, "odd_only", tier=2, accepts=odd_rows),
                          fn(slow_library, "slow_library"))
        # a roomy budget: on a loaded machine the 5 ms one can stop after a round
        arb = Arbiter(registry=reg, mode=mode, policy=ComparePolicy(
            min_rounds=5, max_rounds=15, budget_s=0.1))
        seen: dict[tuple[int, bool], str] = {}
        for i in sequence:
            before = arb.histogram.counts()
            a, b = layout_inputs(*LAYOUTS[i])
            np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-4)
            new = {k for k, v in arb.histogram.counts().items() if v > before.get(k, 0)}
            seen[LAYOUTS[i]] = ",".join(sorted(f"{k[2]}:{k[3]}" for k in new))
        return seen

    for mode in ("static", "tune"):
        got = outcomes(order, mode)
        assert got == outcomes(sorted(order), mode), mode
        assert all(o.endswith(":won") and "," not in o for o in got.values()), got
        assert got[(32, True)] == "slow_library:won"  # the decline fell through


def test_the_plan_table_is_bounded_and_cycling_shapes_keeps_hitting(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plans_module, "MAX_PLANS", 8)
    arb = Arbiter(registry=registry_of(fn(library, "lib")), mode="static")
    planned = {"n": 0}
    real = arb._plan

    def counting(*args: Any) -> Any:
        planned["n"] += 1
        return real(*args)

    monkeypatch.setattr(arb, "_plan", counting)
    working_set = [mats(m, 4, 4) for m in range(1, 7)]
    for _ in range(5):
        for a, b in working_set:
            arb.dispatch("matmul", a, b)
    assert planned["n"] == 6  # planned once each, then every dispatch hits
    for m in range(7, 40):  # a burst of one-off shapes: the table stays bounded
        arb.dispatch("matmul", *mats(m, 4, 4))
        assert len(arb.plans.young("tune")) <= 8 and len(arb.plans._old["tune"]) <= 8
    assert arb.histogram.counts() == {("cpu", "matmul", "lib", "won"): 30 + 33}


def test_a_user_op_with_a_float64_reference_serves_float32() -> None:
    ops = OpRegistry()
    ops.register(make_op("axpy2", lambda x: 2.0 * x.astype(np.float64) + 1.0))
    reg = registry_of(fn(lambda x: 2 * x + 1, "fused", "axpy2"))
    arb = Arbiter(registry=reg, ops=ops, mode="static")
    x = np.arange(8, dtype=np.float32)
    out = arb.dispatch("axpy2", x)
    assert out.dtype == np.float32
    assert arb.histogram.counts() == {("cpu", "axpy2", "fused", "won"): 1}
    declining = Arbiter(registry=registry_of(fn(lambda x: (_ for _ in ()).throw(Decline("no")),
                                             "nope", "axpy2")), ops=ops, mode="static")
    ref = declining.dispatch("axpy2", x)
    assert ref.dtype == np.float32  # the reference's float64 comes back in the input dtype
    np.testing.assert_array_equal(ref, 2 * x + 1)


def test_strict_mode_still_raises_on_a_miss_and_hits_are_gated() -> None:
    arb = Arbiter(registry=registry_of(fn(library, "lib")), mode="strict", cache=MeasureCache())
    with pytest.raises(CacheMiss, match="strict mode"):
        arb.dispatch("matmul", *mats(8, 8, 8))


# -- found in review: each of these failed on the first version of the one arbiter ---------


def test_accepts_raising_decline_in_the_gate_is_a_decline_not_an_error() -> None:
    def even_only(x: np.ndarray) -> bool:
        if x.shape[-1] % 2:
            raise Decline("needs an even last axis")
        return True

    def softmax(x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    arb = Arbiter(registry=registry_of(fn(softmax, "even_softmax", "softmax", accepts=even_only)),
                  mode="static")
    arb.dispatch("softmax", np.random.default_rng(0).standard_normal((4, 64)).astype("f4"))
    assert arb.histogram.counts() == {("cpu", "softmax", "even_softmax", "won"): 1}


def test_a_user_op_decline_on_some_values_does_not_close_the_key(tmp_path: Any) -> None:
    ops = OpRegistry()
    ops.register(make_op("inc_nan", lambda x: x + 1))

    def no_nan(x: np.ndarray) -> np.ndarray:
        if np.isnan(x).any():
            raise Decline("NaN input")
        return x + 1

    def outcomes(order: list[bool]) -> list[str]:
        arb = Arbiter(registry=registry_of(fn(no_nan, "no_nan", "inc_nan")), ops=ops,
                      mode="static")
        seen = []
        for bad in order:
            x = np.ones(8)
            if bad:
                x[0] = np.nan
            before = arb.histogram.counts()
            arb.dispatch("inc_nan", x)
            seen += [f"{k[2]}:{k[3]}" for k, v in arb.histogram.counts().items()
                     if v > before.get(k, 0)]
        return seen

    assert outcomes([False, True, False]) == ["no_nan:won", "no_nan:degraded", "no_nan:won"]
    assert outcomes([True, False, False]) == ["no_nan:degraded", "no_nan:won", "no_nan:won"]


def test_a_raise_in_a_higher_candidates_accepts_is_not_blamed_on_the_fast_one() -> None:
    def picky_accepts(a: np.ndarray, b: np.ndarray) -> bool:
        if a.max() > 100:
            raise ValueError("boom in accepts")
        return bool(a.flags.c_contiguous) and not a.flags.f_contiguous

    reg = registry_of(fn(library, "picky", tier=2, accepts=picky_accepts), fn(np.dot, "lib"))
    arb = Arbiter(registry=reg, mode="static")
    a, b = mats(8, 8, 8)
    arb.dispatch("matmul", np.asfortranarray(a), b)  # picky declines: lib is the fast step
    big = np.asfortranarray(a * 1000)
    np.testing.assert_allclose(arb.dispatch("matmul", big, b), big @ b, rtol=1e-4)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "lib", "won")] == 2
    assert counts[("cpu", "matmul", "picky", "error")] == 1
    assert "boom in accepts" in arb.reasons[("cpu", "matmul", "picky", "error")]
    assert not any(k[2] == "lib" and k[3] != "won" for k in counts)


def test_a_rejected_candidate_is_counted_only_when_a_dispatch_reaches_it() -> None:
    def c_only(a: np.ndarray, b: np.ndarray) -> bool:
        return bool(a.flags.c_contiguous)

    def outcomes(order: str) -> dict[tuple[str, ...], int]:
        reg = registry_of(fn(library, "good_c_only", tier=3, accepts=c_only),
                          fn(zeros, "wrong", tier=2), fn(np.dot, "lib"))
        arb = Arbiter(registry=reg, mode="static")
        a, b = mats(8, 8, 8)
        for layout in order:
            arb.dispatch("matmul", np.asfortranarray(a) if layout == "F" else a, b)
        return arb.histogram.counts()

    assert outcomes("CCCF") == outcomes("FCCC") == {
        ("cpu", "matmul", "good_c_only", "won"): 3, ("cpu", "matmul", "wrong", "rejected"): 1,
        ("cpu", "matmul", "lib", "won"): 1}


def test_a_kernel_wrong_on_one_layout_is_rejected_there_in_any_order() -> None:
    def row_major_only(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        flat = np.frombuffer(np.ascontiguousarray(a).tobytes(), a.dtype) if a.flags.c_contiguous \
            else np.frombuffer(a.tobytes(order="A"), a.dtype)
        return flat.reshape(a.shape) @ b  # reads an F-order buffer as if row-major

    def outcomes(order: str) -> tuple[list[bool], dict[tuple[str, ...], int]]:
        arb = Arbiter(registry=registry_of(fn(row_major_only, "fast", tier=2), fn(np.dot, "lib")),
                      mode="static")
        a, b = mats(16, 16, 16)
        right = []
        for layout in order:
            x = np.asfortranarray(a) if layout == "F" else a
            right.append(bool(np.allclose(arb.dispatch("matmul", x, b), a @ b, rtol=1e-4)))
        return right, arb.histogram.counts()

    expected = {("cpu", "matmul", "fast", "won"): 1, ("cpu", "matmul", "fast", "rejected"): 1,
                ("cpu", "matmul", "lib", "won"): 1}
    assert outcomes("CF") == ([True, True], expected)
    assert outcomes("FC") == ([True, True], expected)


def test_staging_that_raises_while_measuring_is_an_error_not_an_escape() -> None:
    class Staged(FunctionCandidate):
        def prepare_inputs(self, *inputs: Any) -> tuple[Any, ...]:
            raise RuntimeError("cannot stage this buffer")

    reg = registry_of(Staged(library, "staged", "matmul", "cpu", 2, None, None), fn(np.dot, "lib"))
    arb = Arbiter(registry=reg, mode="tune", policy=FAST)
    a, b = mats(8, 8, 8)
    np.testing.assert_allclose(arb.dispatch("matmul", a, b), a @ b, rtol=1e-5)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "lib", "won")] == 1
    assert ("cpu", "matmul", "staged", "error") in counts


def test_the_gate_runs_once_per_candidate_key_and_layout() -> None:
    calls = {"n": 0}

    def counted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        calls["n"] += 1
        return np.zeros((a.shape[0], b.shape[1]), a.dtype)

    arb = Arbiter(registry=registry_of(fn(counted, "wrong", tier=2), fn(np.dot, "lib")),
                  mode="tune", policy=FAST)
    for m in (8, 8, 8, 8):
        arb.dispatch("matmul", *mats(m, 8, 8))
    gated_once = calls["n"]
    for m in (9, 10, 11):  # other keys: each gated on its own, the first key left alone
        arb.dispatch("matmul", *mats(m, 8, 8))
    arb.dispatch("matmul", *mats(8, 8, 8))
    assert calls["n"] <= gated_once * 4  # three more keys, nothing more for the first


def test_a_dispatch_to_an_unknown_target_names_the_known_ones() -> None:
    arb = Arbiter(registry=registry_of(fn(library, "lib")), mode="static")
    with pytest.raises(ValueError, match="unknown target 'tpu'; known targets: amd, cpu"):
        arb.dispatch("matmul", *mats(4, 4, 4), target="tpu")
    assert len(arb.histogram) == 0


def test_the_seed_calls_are_the_process_arbiter_in_their_own_mode() -> None:
    """``run_arbitrated`` never measures and ``run_measured_arbitrated`` measures at the
    first miss, both on the process arbiter: its one histogram counts them."""
    from pytest_arbiter.decision.process import (
        default_arbiter,
        run_arbitrated,
        run_measured_arbitrated,
    )

    own = default_arbiter()
    before = sum(own.histogram.counts().values())
    run_arbitrated("softmax", np.ones((2, 3), np.float32))
    run_measured_arbitrated("softmax", np.ones((2, 5), np.float32))
    assert sum(own.histogram.counts().values()) == before + 2
    assert default_arbiter() is own


def softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def contiguous_only(x: np.ndarray) -> np.ndarray:
    """Right on C-contiguous inputs; reads a strided view as if it were contiguous."""
    if x.flags.c_contiguous:
        return softmax_ref(x)
    flat = np.frombuffer(x.base.tobytes() if x.base is not None else x.tobytes(),
                         dtype=x.dtype)[:x.size].reshape(x.shape)
    return softmax_ref(flat)


@pytest.mark.parametrize("view", ["rows", "columns", "reversed"])
def test_a_kernel_wrong_on_a_strided_view_never_runs_for_it(view: str) -> None:
    """The gate runs the kernel on the dispatch's own layout (not a contiguous copy), and
    each strided layout is gated on its own: one that passed does not vouch for another."""
    reg = registry_of(fn(contiguous_only, "contiguous_only", "softmax", tier=1),
                      fn(softmax_ref, "plain", "softmax"))
    base = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32)
    arb = Arbiter(registry=reg, mode="static")
    np.testing.assert_allclose(arb.dispatch("softmax", base), softmax_ref(base), rtol=1e-5)
    x = {"rows": base[::2, :], "columns": base[:, ::2], "reversed": base[::-1]}[view]
    for _ in range(3):
        np.testing.assert_allclose(arb.dispatch("softmax", x), softmax_ref(x), rtol=1e-5)
    counts = arb.histogram.counts()
    assert counts[("cpu", "softmax", "contiguous_only", "won")] == 1  # the contiguous one
    assert counts[("cpu", "softmax", "contiguous_only", "rejected")] == 3
    assert counts[("cpu", "softmax", "plain", "won")] == 3


def test_a_replayed_corpus_shows_the_kernel_that_failed_the_gate_when_measured() -> None:
    """The tuned ranking never reaches the broken kernel again; a run replaying the corpus
    still records it, once per key, like the tuning run (so CPU CI, and a baseline written
    there, see it too); not once its code changed."""
    cands = (fn(zeros, "zeros", tier=5), fn(library, "library"))
    tuner = Arbiter(registry=registry_of(*cands), mode="tune", policy=FAST)
    for n in (16, 32):
        for _ in range(3):
            tuner.dispatch("matmul", *mats(n, n, n))
    tuned = {k: v for k, v in tuner.histogram.counts().items() if k[3] == "rejected"}
    assert tuned == {("cpu", "matmul", "zeros", "rejected"): 2}
    replay = Arbiter(registry=registry_of(*cands), cache=tuner.cache, mode="static")
    for n in (16, 32):
        for _ in range(3):
            replay.dispatch("matmul", *mats(n, n, n))
    assert replay.histogram.counts() == {("cpu", "matmul", "zeros", "rejected"): 2,
                                         ("cpu", "matmul", "library", "won"): 6}
    assert replay.reasons[("cpu", "matmul", "zeros", "rejected")].startswith(
        "when measured: failed the F4 gate: output is all zeros")

    def fixed(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.matmul(a, b)

    edited = Arbiter(registry=registry_of(fn(fixed, "zeros", tier=5), fn(library, "library")),
                     cache=tuner.cache, mode="static")
    edited.dispatch("matmul", *mats(16, 16, 16))
    assert not any(k[3] == "rejected" for k in edited.histogram.counts())


def wrong_on_broadcast(x: np.ndarray) -> np.ndarray:
    """Right, except on an input with a zero stride (a broadcast view)."""
    if 0 in x.strides:
        return np.zeros_like(x)
    return softmax_ref(x)


def wrong_on_reversed(x: np.ndarray) -> np.ndarray:
    if any(stride < 0 for stride in x.strides):
        return np.zeros_like(x)
    return softmax_ref(x)


def test_a_broadcast_view_is_gated_apart_from_a_gapped_one() -> None:
    reg = registry_of(fn(wrong_on_broadcast, "fast", "softmax", tier=1),
                      fn(softmax_ref, "plain", "softmax"))
    arb = Arbiter(registry=reg, mode="static")
    base = np.random.default_rng(5).standard_normal((32, 16)).astype(np.float32)
    gapped = base[::2]
    broadcast = np.broadcast_to(base[0:1], (16, 16))
    np.testing.assert_allclose(arb.dispatch("softmax", gapped), softmax_ref(gapped),
                               rtol=1e-5)
    np.testing.assert_allclose(arb.dispatch("softmax", broadcast), softmax_ref(broadcast),
                               rtol=1e-5)
    assert arb.histogram.counts() == {("cpu", "softmax", "fast", "won"): 1,
                                      ("cpu", "softmax", "fast", "rejected"): 1,
                                      ("cpu", "softmax", "plain", "won"): 1}


def slow_softmax(x: np.ndarray) -> np.ndarray:
    for _ in range(8):
        out = softmax_ref(x)
    return out


@pytest.mark.timing  # the setup needs the tune to pick the 8x faster kernel
def test_gate_off_vouches_only_for_the_row_major_inputs_it_was_gated_on() -> None:
    cands = (fn(wrong_on_reversed, "fast", "softmax", tier=1),
             fn(slow_softmax, "plain", "softmax"))
    base = np.random.default_rng(6).standard_normal((16, 16)).astype(np.float32)
    tuner = Arbiter(registry=registry_of(*cands), mode="tune", policy=FAST)
    tuner.dispatch("softmax", base)
    assert tuner.cache.entries()[0].winner == "fast"
    production = Arbiter(registry=registry_of(*cands), cache=tuner.cache, mode="static",
                         gate=False)
    reversed_view = base[::-1]
    np.testing.assert_allclose(production.dispatch("softmax", reversed_view),
                               softmax_ref(reversed_view), rtol=1e-5)
    assert ("cpu", "softmax", "fast", "rejected") in production.histogram.counts()


def test_findings_planned_by_one_thread_are_recorded_under_their_own_op() -> None:
    """A replayed rejection of a matmul key, planned while another thread's softmax
    dispatch runs, is recorded as matmul's, not softmax's."""
    cands = (fn(zeros, "zeros", tier=5), fn(library, "library"),
             fn(softmax_ref, "plain", "softmax"))
    tuner = Arbiter(registry=registry_of(*cands), mode="tune", policy=FAST)
    a, b = mats(16, 16, 16)
    tuner.dispatch("matmul", a, b)
    replay = Arbiter(registry=registry_of(*cands), cache=tuner.cache, mode="static")
    # the interleaving by hand: the matmul plan is made, then softmax dispatches first
    replay._find_plan("static", "matmul", (a, b), None, None)
    x = np.ones((4, 8), np.float32)
    replay.dispatch("softmax", x)
    counts = replay.histogram.counts()
    assert counts.get(("cpu", "matmul", "zeros", "rejected")) == 1
    assert ("cpu", "softmax", "zeros", "rejected") not in counts


def test_a_plain_number_input_is_planned_once_per_type(monkeypatch: pytest.MonkeyPatch,
                                                       clean_registry: None) -> None:
    """A user op's plain-number argument (an ``eps``, a scale) is part of the plan's
    signature by its type: repeat dispatches hit the memoised plan."""
    import pytest_arbiter

    pytest_arbiter.op("td_scale", reference=lambda x, s: x * s)

    @pytest_arbiter.candidate("td_scale", target="cpu", name="td_mul")
    def mul(x: np.ndarray, s: float) -> np.ndarray:
        return x * s

    arb = Arbiter(mode="static")
    planned = {"n": 0}
    real = arb._plan

    def counting(*args: Any, **kwargs: Any) -> Any:
        planned["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(arb, "_plan", counting)
    x = np.ones(8)
    for scale in (2.0, 3.0, 4.0):
        np.testing.assert_allclose(arb.dispatch("td_scale", x, scale), x * scale)
    arb.dispatch("td_scale", x, 2)  # another type: another plan
    assert planned["n"] == 2
    assert arb.histogram.counts() == {("cpu", "td_scale", "td_mul", "won"): 4}
