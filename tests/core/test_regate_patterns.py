"""Issue 27, point 7: a gate that knows what it checked. A failed trial says whether its
reason is numerical (NaN, overflow, far over budget) and which pattern made it; a
derived trial's pattern is made again for another key's shapes and dtypes, where it
rejects the kernel it failed even when that key's own trials pass it, and passes every
correct kernel; the report lists the patterns a candidate passed. Each test fails on
the gate before point 7 (no ``numeric``, ``pattern`` or ``regate``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from pytest_arbiter import f4_gate
from pytest_arbiter.core.candidates import FunctionCandidate
from pytest_arbiter.core.gate import GateReport
from pytest_arbiter.core.ops import OPS, Op, make_op
from pytest_arbiter.core.regions import SoftmaxRegion
from pytest_arbiter.core.user_inputs import PATTERN_KINDS, Pattern, derived_trials
from tests.factories import lse_naive, lse_ref, lse_shifted

Kernel = Callable[..., np.ndarray]
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def _gate(fn: Kernel, op: Op, inputs: tuple[Any, ...], regate: tuple[Pattern, ...] = (),
          seed: int = 7) -> GateReport:
    cand = FunctionCandidate(fn, fn.__name__, op.name, "cpu", 0, None, None)
    return f4_gate(cand, op, inputs=inputs, seed=seed, regate=regate)


def norm_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    v = x.astype(np.float64)
    centred = v - v.mean(axis=-1, keepdims=True)
    out: np.ndarray = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True)
                                        + 1e-5) * w.astype(np.float64)
    return out


def norm_two_pass(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    v = x.astype(np.float32)
    centred = v - v.mean(axis=-1, keepdims=True)
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return (centred / np.sqrt(var + np.float32(1e-5)) * w.astype(np.float32)).astype(x.dtype)


def cumsum_ref(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.cumsum(x.astype(np.float64), axis=-1)
    return out


def cumsum_f32(x: np.ndarray) -> np.ndarray:
    return np.cumsum(x.astype(np.float32), axis=-1).astype(x.dtype)


def _grid_logits(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """A test's logits on a coarse grid (6 values): the derived trials keep such an
    input as it is, so its key's own trials never get large."""
    return np.random.default_rng(3).integers(-3, 3, shape).astype(dtype)


def test_a_failed_trial_names_its_numerical_reason_and_its_pattern() -> None:
    op = make_op("t27p7_lse", lse_ref)
    x = np.random.default_rng(0).standard_normal((8, 300)).astype(np.float32)
    report = _gate(lse_naive, op, (x,))
    assert not report.passed
    failing = report.failing
    assert failing is not None and failing.status == "fail"
    assert (failing.numeric, failing.pattern) == ("overflow", "large_magnitude")
    assert failing.recipe is not None and failing.recipe.kind == "large_magnitude"
    assert failing.recipe.top > 1e6 and not failing.regated

    def nan_rows(x: np.ndarray) -> np.ndarray:
        out = lse_shifted(x)
        out[0] = np.nan
        return out

    def far_off(x: np.ndarray) -> np.ndarray:
        return (lse_shifted(x).astype(np.float32) * np.float32(1.5)).astype(x.dtype)

    def a_little_off(x: np.ndarray) -> np.ndarray:
        return (lse_shifted(x).astype(np.float64) * (1.0 + 2e-5)).astype(x.dtype)

    assert _gate(nan_rows, op, (x,)).failing.numeric == "nonfinite"  # type: ignore[union-attr]
    assert _gate(far_off, op, (x,)).failing.numeric == "far_over_budget"  # type: ignore[union-attr]
    near = _gate(a_little_off, op, (x,))
    assert near.failing is not None and 1.0 < near.failing.worst_ratio <= 100.0
    assert near.failing.numeric is None  # out of budget, but not by 100x: not numerical


def test_the_failing_pattern_made_for_another_keys_shapes_rejects_there() -> None:
    """The naive logsumexp fails large magnitudes on 8x300 logits; on a key whose test
    logits lie on a coarse grid it passes its own gate (no derived trial varies them),
    and fails the pattern made for that key's shapes."""
    op = make_op("t27p7_lse", lse_ref)
    x = np.random.default_rng(0).standard_normal((8, 300)).astype(np.float32)
    recipe = _gate(lse_naive, op, (x,)).failing.recipe  # type: ignore[union-attr]
    assert recipe is not None
    for dtype in DTYPES.values():
        other = _grid_logits((16, 64), dtype)
        alone = _gate(lse_naive, op, (other,))
        assert alone.passed, alone.summary()
        again = _gate(lse_naive, op, (other,), regate=(recipe,))
        assert not again.passed
        failing = again.failing
        assert failing is not None and failing.regated and failing.shapes == "16x64"
        assert (failing.pattern, failing.numeric) == ("regated large_magnitude", "overflow")
        # the correct kernel passes the same trial: it was checked, not skipped
        right = _gate(lse_shifted, op, (other,), regate=(recipe,))
        assert right.passed and right.passed_patterns == ("own", "regated large_magnitude")


def _patterns(inputs: tuple[Any, ...]) -> list[Pattern]:
    made = [t.recipe for t in derived_trials(inputs, 11)]
    assert [p.kind for p in made if p is not None] == list(PATTERN_KINDS)
    return [p for p in made if p is not None]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_correct_kernel_passes_every_pattern_made_for_other_keys(dtype: str) -> None:
    """No false rejects: each derived pattern of a small float32 key (logits of RMS 30,
    rows of 16) and of a wide one, made again on other shapes, in each dtype and over
    seeds, passes a correct logsumexp, a two-pass norm and a float32 cumsum."""
    rng = np.random.default_rng(5)
    cases: list[tuple[Op, Kernel, Callable[[tuple[int, int]], tuple[Any, ...]]]] = [
        (make_op("t27p7_lse", lse_ref), lse_shifted,
         lambda s: (rng.standard_normal(s) * 30,)),
        (make_op("t27p7_norm", norm_ref), norm_two_pass,
         lambda s: (rng.standard_normal(s) + 3.0, 1.0 + rng.random(s[1]))),
        (make_op("t27p7_cumsum", cumsum_ref), cumsum_f32,
         lambda s: (rng.standard_normal(s),)),
    ]
    cast = DTYPES[dtype]
    for op, kernel, draw in cases:
        patterns = [*_patterns(tuple(np.asarray(a, np.float32) for a in draw((4, 16)))),
                    *_patterns(tuple(np.asarray(a, np.float32) for a in draw((3, 2000))))]
        for shape in ((64, 1000), (2, 4097), (33, 7)):
            inputs = tuple(np.asarray(a).astype(cast) for a in draw(shape))
            for seed in range(3):
                report = _gate(kernel, op, inputs, tuple(patterns), seed=seed)
                assert report.passed, report.summary()
                regated = [t for t in report.trials if t.regated]
                assert len(regated) == len(set(patterns))


def test_the_report_lists_the_patterns_a_candidate_passed() -> None:
    op = make_op("t27p7_lse", lse_ref)
    x = np.random.default_rng(0).standard_normal((8, 300)).astype(np.float32)
    report = _gate(lse_shifted, op, (x,))
    assert report.passed_patterns == ("own", "fresh", "large_magnitude", "large_offset",
                                      "special")
    # a built-in op's generated inputs, by their index
    region = SoftmaxRegion.of((8, 300), "float32")
    softmax = FunctionCandidate(lambda x: _softmax(x), "t27p7_softmax", "softmax", "cpu", 0,
                                None, None)
    built_in = f4_gate(softmax, OPS.get("softmax"), region=region)
    assert built_in.passed, built_in.summary()
    assert built_in.passed_patterns == tuple(f"generated #{i}"
                                             for i in range(len(built_in.trials)))
    # a skipped trial checked nothing: not listed
    short = make_op("t27p7_cumsum", cumsum_ref)
    big = np.random.default_rng(1).standard_normal((4, 70000)).astype(np.float16)
    skipping = _gate(cumsum_f32, short, (big,))
    assert "large_magnitude" not in skipping.passed_patterns
    assert any(t.status == "skipped" and t.pattern == "large_magnitude"
               for t in skipping.trials)


def _softmax(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float32)
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)
