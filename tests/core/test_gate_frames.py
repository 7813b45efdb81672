"""The statistical checks' frames are made for a gate's trials together, once per trial:
each value bit for bit the one a trial alone gets (and the plain formulas give), the
correctly rounded values without a cast to the narrow type, and the checks' verdicts
kept with the bits each trial's output had when it was judged."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import SoftmaxRegion, f4_gate
from pytest_arbiter.core import gate as gate_module, gate_stats
from pytest_arbiter.core.candidates import FunctionCandidate
from pytest_arbiter.core.dtypes import precision, round_to, spacing
from pytest_arbiter.core.gate import GATE_SEED
from pytest_arbiter.core.ops import ERROR_LAMBDA, OPS, make_op
from pytest_arbiter.core.regions import MatmulRegion, Region
from pytest_arbiter.core.trials import CHECKSUM_BYTES, forget_region_trials, gate_trials
from pytest_arbiter.core.user_inputs import derived_trials


def _requests(op_name: str, region: Region) -> list[gate_stats.FrameRequest]:
    """The frame requests of a built-in op's trials on ``region`` (those the checks read)."""
    op = OPS.get(op_name)
    trials = gate_trials(op, inputs=None, region=region, seed=GATE_SEED)
    out = []
    with np.errstate(all="ignore"):
        for prep in trials.trials:
            if prep.skip_reason(op):
                continue
            assert prep.expected is not None and prep.trial.seed is not None
            model, _ = prep.budget_for(op, region.dtype)
            assert model is not None
            out.append(gate_stats.FrameRequest(prep.expected[0].reshape(-1), None, model,
                                               prep.trial.seed))
    return out


def _plain_terms(u: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The bias and spread checks' thresholds and sums by their plain formulas, for one
    trial's units alone (docs/accuracy.md)."""
    v = u.sd + u.sd ** 2 + u.common + u.systematic
    w = 1.0 / np.maximum(v, 1.0 / 12.0)
    shared = float(np.add.reduce(np.bincount(u.group, weights=w * u.common) ** 2)) \
        if u.common.any() else 0.0
    log_term = math.log(2.0 / gate_stats.STAT_ALPHA)

    def bernstein(variance: float, largest: float) -> float:
        return math.sqrt(2.0 * log_term * variance) + 2.0 / 3.0 * log_term * largest

    bias = (bernstein(float(np.add.reduce(w * w * v)) + shared,
                      float(np.maximum.reduce(2.0 * w * (u.bound + 0.5)))),
            float(np.add.reduce(w * u.systematic)), float(np.add.reduce(w)))
    sd2 = u.sd ** 2
    expected = sd2 + u.systematic ** 2
    w = 1.0 / np.maximum(expected, 1.0 / 12.0)
    reach = u.bound + 0.5
    if u.common.any():
        common2 = u.common ** 2
        fit_total = np.maximum(np.bincount(u.group, weights=w * common2), 1e-300)
        noise = np.bincount(u.group, weights=w * w * common2 * (expected + 0.25)) \
            / fit_total ** 2
        expected = expected + common2 * noise[u.group]
        reach = reach + ERROR_LAMBDA * u.common
    flips = u.sd + sd2 + u.systematic + u.common + expected
    spread = (float(np.add.reduce(w * expected)),
              bernstein(float(np.add.reduce(w * w * flips * reach ** 2)),
                        float(np.maximum.reduce(w * (reach ** 2 + 0.25)))),
              float(np.add.reduce(w)))
    return bias, spread


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("op_name", "region"), [
    ("softmax", SoftmaxRegion.of((8, 300), "float32")),
    ("softmax", SoftmaxRegion.of((3, 33), "float16")),
    ("softmax", SoftmaxRegion.of((2, 3, 97), "bfloat16")),
    ("matmul", MatmulRegion.of(24, 16, 40, "float32")),
    ("matmul", MatmulRegion.of(9, 7, 300, "bfloat16")),
])
def test_a_batch_of_frames_is_each_trials_frame_alone_bit_for_bit(
        op_name: str, region: Region, monkeypatch: pytest.MonkeyPatch) -> None:
    """Made together (every trial, however many outputs it samples), each trial's frame
    holds what it holds made alone, field by field and bit for bit, and its thresholds
    and sums are the plain formulas' over its units."""
    requests = _requests(op_name, region)
    assert len(requests) > 2
    with np.errstate(all="ignore"):
        monkeypatch.setattr(gate_stats, "BATCHED_UP_TO", 1 << 30)
        monkeypatch.setattr(gate_stats, "BATCH_SAMPLES", 1 << 30)
        together = gate_stats.frames(requests, region.dtype)
        monkeypatch.setattr(gate_stats, "BATCHED_UP_TO", -1)
        alone = gate_stats.frames(requests, region.dtype)
    checked = 0
    for one, other in zip(together, alone, strict=True):
        for name in ("index", "e", "ulp", "ideal", "starts", "counts"):
            assert _same(getattr(one, name), getattr(other, name)), name
        for name in ("z_ideal", "sign", "sd", "common", "systematic", "bound", "group"):
            assert _same(getattr(one.units, name), getattr(other.units, name)), name
        assert (one.bias is None) == (other.bias is None)
        if one.bias is None or one.spread is None or other.spread is None:
            continue
        with np.errstate(all="ignore"):
            bias, spread = _plain_terms(one.units)
        for frame in (one, other):
            assert frame.bias is not None and frame.spread is not None
            assert _same(frame.bias[2:], bias)
            assert _same((frame.spread.mean, frame.spread.threshold, frame.spread.total),
                         spread)
        checked += 1
    assert checked


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_nearest_is_round_to_bit_for_bit(rng: np.random.Generator, dtype: str) -> None:
    """Rounding on the spacing's grid is the cast's rounding: ties to even, subnormals,
    the largest finite number and past it (an infinity), zeros of either sign."""
    p = precision(dtype)
    base = rng.standard_normal(4000) * np.exp2(rng.integers(-150, 130, 4000))
    ulp = spacing(base, dtype)
    ties = (np.rint(base / ulp) + 0.5) * ulp
    values = np.concatenate([
        base, ties, ties * (1.0 + 2.0 ** -40), ties * (1.0 - 2.0 ** -40),
        rng.standard_normal(500) * p.smallest_normal,
        [0.0, -0.0, p.largest, -p.largest, p.largest * (1.0 + p.unit_roundoff),
         p.largest * (1.0 + 0.99 * p.unit_roundoff), 1e300, -1e300, 5e-324,
         p.smallest_subnormal / 2.0, -p.smallest_subnormal * 1.5]])
    with np.errstate(over="ignore"):
        got = gate_stats.nearest(values, spacing(values, dtype), dtype)
    assert got.tobytes() == round_to(values, dtype).tobytes()


def _softmax(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    out: np.ndarray = (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)
    return out


def test_a_regions_frames_are_made_once_together_and_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A region's first gate makes its trials' frames in one batch; the next candidates
    gated on the kept trials make none (a frame reads no output)."""
    batches: list[int] = []
    real = gate_stats.frames

    def counting(requests: Any, dtype: str) -> Any:
        batches.append(len(requests))
        return real(requests, dtype)

    monkeypatch.setattr(gate_module, "frames", counting)
    forget_region_trials()
    region = SoftmaxRegion.of((8, 300), "float32")
    op = OPS.get("softmax")
    first = f4_gate(FunctionCandidate(_softmax, "plain", "softmax", "cpu", 0, None, None),
                    op, region=region)
    assert first.passed, first.summary()
    checked = sum(1 for t in first.trials if t.bias or t.spread)
    assert batches == [checked] and checked > 2
    again = f4_gate(FunctionCandidate(lambda x: _softmax(x) + 0, "again", "softmax", "cpu",
                                      0, None, None), op, region=region)
    assert again.passed and batches == [checked]
    forget_region_trials()


def test_a_kernel_reusing_one_buffer_is_judged_on_each_trials_bits() -> None:
    """The statistical checks run after the candidate's last trial: a kernel returning one
    buffer for every input of a shape (the next call overwrites the last output) is
    judged, and its verdict kept, on the bits each call returned."""
    buffers: dict[tuple[int, ...], np.ndarray] = {}

    def into_buffer(x: np.ndarray) -> np.ndarray:
        out = buffers.setdefault((*x.shape, x.dtype.num), np.empty(x.shape, x.dtype))
        out[...] = _softmax(x)
        return out

    region = SoftmaxRegion.of((8, 300), "float32")
    op = OPS.get("softmax")
    trials = gate_trials(op, inputs=None, region=region, seed=GATE_SEED)
    report = f4_gate(FunctionCandidate(into_buffer, "buffer", "softmax", "cpu", 0, None,
                                       None), op, region=region, trials=trials)
    plain = f4_gate(FunctionCandidate(_softmax, "plain", "softmax", "cpu", 0, None, None),
                    op, region=region)
    assert report.passed, report.summary()
    assert [t.bias for t in report.trials] == [t.bias for t in plain.trials]
    with np.errstate(all="ignore"):
        for prep in trials.trials:
            kept, _, _ = prep.judged[0]
            assert kept.tobytes() == _softmax(prep.trial.inputs[0]).tobytes()


def test_a_pattern_regated_twice_is_judged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A trial met twice in one gate (a pattern re-gated twice) is judged once: its
    second run finds the first's verdict, as when each trial was settled in turn."""
    judged: list[int] = []
    real = gate_module._judge_values

    def counting(op: Any, index: int, prep: Any, out: np.ndarray) -> Any:
        judged.append(index)
        return real(op, index, prep, out)

    monkeypatch.setattr(gate_module, "_judge_values", counting)
    op = make_op("regated_twice", lambda x: np.asarray(x, dtype=np.float64) * 2.0)
    x = np.random.default_rng(3).standard_normal((16, 64)).astype(np.float32)
    pattern = next(t.recipe for t in derived_trials((x,), 11) if t.recipe is not None)
    cand = FunctionCandidate(lambda a: a * np.float32(2.0), "twice", op.name, "cpu", 0,
                             None, None)
    report = f4_gate(cand, op, inputs=(x,), seed=GATE_SEED, regate=(pattern, pattern))
    assert report.passed, report.summary()
    last, again = report.trials[-2:]
    assert last.regated and again.regated and again.index == last.index + 1
    assert judged.count(again.index) == 0 and judged.count(last.index) == 1
    assert (again.bias, again.spread, again.status) == (last.bias, last.spread, last.status)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_large_input_written_by_one_bit_is_caught(dtype: str) -> None:
    """Past CHECKSUM_BYTES an input is compared element by element as integers: a kernel
    that turns one zero of it into a negative zero modifies its inputs."""
    rows = CHECKSUM_BYTES // (np.dtype(dtype).itemsize * 64) + 8
    x = np.random.default_rng(5).standard_normal((rows, 64)).astype(dtype)
    x[3, 5] = 0.0
    assert x.nbytes > CHECKSUM_BYTES

    def flips_a_zero(a: np.ndarray) -> np.ndarray:
        out = _softmax(a)
        a[3, 5] = -0.0
        return out

    op = OPS.get("softmax")
    report = f4_gate(FunctionCandidate(flips_a_zero, "flips", "softmax", "cpu", 0, None,
                                       None), op, inputs=(x,))
    assert report.failing is not None and report.failing.reason == \
        "the kernel modified its inputs"


def test_the_order_of_even_runs_per_group_is_lexsorts(rng: np.random.Generator) -> None:
    """Outputs in runs of one length per rising group (a softmax's rows sampled evenly)
    are sorted as the rows of a matrix: the order is ``np.lexsort``'s, ties in place; runs
    that are not even, or groups that do not rise, take the general sort, alike."""
    values = rng.choice([-1.5, -0.0, 0.0, 2.0 ** -140, 1.0, 3.25], 8 * 150)
    values[::3] = rng.standard_normal(values[::3].size)
    for groups in (np.repeat(np.arange(8), 150), np.repeat(np.arange(3, 27, 3), 150),
                   np.repeat(np.arange(8)[::-1], 150), np.sort(rng.integers(0, 8, 1200)),
                   np.repeat(np.arange(2), 600), np.repeat(np.arange(1200), 1)):
        order = gate_stats._by_group_then_value(groups, values)
        assert order.tolist() == np.lexsort((values, groups)).tolist()
