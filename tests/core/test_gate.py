"""The F4 gate: every correct kernel passes for every dtype; each kind of wrong one fails."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pytest_arbiter import Decline, MatmulRegion, SoftmaxRegion, f4_gate
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.dtypes import DTYPE_NAMES
from pytest_arbiter.core.gate import GATE_SEED
from pytest_arbiter.core.ops import OPS, make_op

DTYPES = list(DTYPE_NAMES)
MATMUL_SHAPES = [(32, 16, 32), (24, 16, 32), (1, 7, 300), (65, 33, 512)]


def cand(fn, op="matmul", name=None, accepts=None):  # type: ignore[no-untyped-def]
    return FunctionCandidate(fn, name or fn.__name__, op, "cpu", 0, accepts, None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", MATMUL_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["blas_matmul", "dot_matmul", "panel_matmul"])
def test_bundled_matmul_kernels_pass(registry: CandidateRegistry, name: str,
                                     shape: tuple[int, int, int], dtype: str) -> None:
    m, n, k = shape
    report = f4_gate(registry.get(name), OPS.get("matmul"), region=MatmulRegion.of(m, n, k, dtype))
    if name == "panel_matmul" and k % 256:
        assert not report.passed and "declined every gate input" in report.reason
    else:
        assert report.passed, report.summary()
        assert 0.0 <= report.worst_ratio <= 1.0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8, 300), (3, 4, 17), (1000,)], ids=str)
@pytest.mark.parametrize("name", ["stable_softmax", "inplace_softmax"])
def test_bundled_softmax_kernels_pass(registry: CandidateRegistry, name: str,
                                      shape: tuple[int, ...], dtype: str) -> None:
    report = f4_gate(registry.get(name), OPS.get("softmax"), region=SoftmaxRegion.of(shape, dtype))
    assert report.passed, report.summary()


def low_precision_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Accumulates sequentially in float16 (a float64 input: in float32)."""
    acc_dtype = np.float32 if a.dtype == np.float64 else np.float16
    acc = np.zeros((a.shape[0], b.shape[1]), dtype=acc_dtype)
    for i in range(a.shape[1]):
        acc += np.outer(a[:, i], b[i]).astype(acc_dtype)
    return acc.astype(a.dtype)


def zeros_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.zeros((a.shape[0], b.shape[1]), dtype=a.dtype)


def garbage_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.matmul(a.astype(np.float64), b.astype(np.float64))
    out[np.random.default_rng(0).random(out.shape) < 0.02] = 7.0
    return out.astype(a.dtype)


def wrong_shape_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype).T.copy()


def wrong_dtype_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    other = np.float32 if a.dtype == np.float64 else np.float64
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(other)


def nan_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    out.flat[3] = np.nan
    return out


def mutating_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    a[0, 0] = 0
    return out


def raising_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    raise RuntimeError("kernel launch failed")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, expected", [
    (low_precision_matmul, "exceeds the allowed"),
    (zeros_matmul, "all zeros"),
    (garbage_matmul, "exceeds the allowed"),
    (wrong_shape_matmul, "output shape"),
    (wrong_dtype_matmul, "output dtype"),
    (nan_matmul, "NaN/Inf"),
    (mutating_matmul, "modified its inputs"),
    (raising_matmul, "RuntimeError"),
], ids=lambda v: getattr(v, "__name__", ""))
def test_wrong_matmul_kernels_fail(kernel, expected: str, dtype: str) -> None:  # type: ignore[no-untyped-def]
    report = f4_gate(cand(kernel), OPS.get("matmul"), region=MatmulRegion.of(48, 40, 256, dtype))
    assert not report.passed
    assert expected in report.reason, report.summary()
    assert report.failing is not None
    assert report.failing.shapes  # the report names the shape and seed that failed
    text = report.summary()
    assert "FAILED" in text and "budget" in text and "seed" in text


def naive_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float32))
    return (e / e.sum(axis=-1, keepdims=True)).astype(x.dtype)


def half_sum_softmax(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float32)
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    total = np.zeros((*e.shape[:-1], 1), dtype=np.float16)
    for j in range(e.shape[-1]):
        total += e[..., j:j + 1].astype(np.float16)
    return (e / total.astype(np.float32)).astype(x.dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kernel", [naive_softmax, half_sum_softmax], ids=lambda k: k.__name__)
def test_wrong_softmax_kernels_fail(kernel, dtype: str) -> None:  # type: ignore[no-untyped-def]
    report = f4_gate(cand(kernel, op="softmax"), OPS.get("softmax"),
                     region=SoftmaxRegion.of((4, 512), dtype))
    assert not report.passed, report.summary()


def test_gate_on_dispatch_inputs_includes_them(rng: np.random.Generator) -> None:
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    report = f4_gate(cand(np.matmul), OPS.get("matmul"), inputs=(a, b))
    assert report.passed
    assert report.trials[0].seed is None and report.trials[0].shapes == "5x7, 7x3"
    generated = OPS.get("matmul").gate_inputs(MatmulRegion.of(5, 3, 7, "float32"), GATE_SEED)
    assert len(report.trials) == 1 + len(generated)


def test_declining_kernel_is_not_a_pass() -> None:
    def declines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise Decline("not today")

    report = f4_gate(cand(declines), OPS.get("matmul"), region=MatmulRegion.of(8, 8, 8, "float32"))
    assert not report.passed
    assert all(t.status == "declined" for t in report.trials)


def test_user_op_gates_on_its_own_inputs(rng: np.random.Generator) -> None:
    def axpy_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return (2.0 * x.astype(np.float64) + y).astype(x.dtype)

    the_op = make_op("axpy_gate_test", axpy_ref)
    x = rng.standard_normal(100).astype(np.float32)
    y = rng.standard_normal(100).astype(np.float32)
    good = f4_gate(cand(lambda x, y: 2 * x + y, op="axpy_gate_test", name="good"), the_op,
                   inputs=(x, y))
    bad = f4_gate(cand(lambda x, y: 2 * x - y, op="axpy_gate_test", name="bad"), the_op,
                  inputs=(x, y))
    assert good.passed, good.summary()
    assert not bad.passed
    # the dispatch's own inputs first, then the trials derived from them (issue 27)
    assert good.trials[0].seed is None and good.trials[0].input == "the dispatch's own inputs"
    assert len(good.trials) == 5


# -- gate power: tight bounds, statistical checks, generated inputs, TF32 ---------------------
#
# The new names are read through their modules inside each test, so each test fails on its
# own (not at import) against a gate without them.

from pytest_arbiter.core import (  # noqa: E402
    dtypes as dtypes_module,
    gate as gate_module,
    ops as ops_module,
)


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32)


def ordered_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Products rounded to float32 and added one by one, k = 0, 1, ... (NumPy reduces a
    non-contiguous axis in order): the correct order with the largest error."""
    products = _f32(a).T[:, :, None] * _f32(b)[:, None, :]
    return np.add.reduce(products, axis=0).astype(a.dtype)


def reversed_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    products = _f32(a).T[:, :, None] * _f32(b)[:, None, :]
    return np.add.reduce(products[::-1], axis=0).astype(a.dtype)


def pairwise_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(_f32(a)[:, None, :] * _f32(b).T[None, :, :], axis=-1).astype(a.dtype)


def split_k_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    half = a.shape[1] // 2
    left = np.matmul(_f32(a[:, :half]), _f32(b[:half]))
    return (left + np.matmul(_f32(a[:, half:]), _f32(b[half:]))).astype(a.dtype)


def float64_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


def truncate(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` rounded toward zero into ``dtype`` (the bug of a hand-written cast)."""
    out = values.astype(dtype)
    bits = out.view(np.uint16 if out.itemsize == 2 else np.uint32).copy()
    bits[(np.abs(out.astype(np.float64)) > np.abs(values)) & (out != 0)] -= 1
    return bits.view(dtype)


def truncated_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return truncate(np.matmul(a.astype(np.float64), b.astype(np.float64)), a.dtype)


def scaled_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.matmul(_f32(a), _f32(b)) * np.float32(1.001)).astype(a.dtype)


def corner_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One element off by 1e-4 of the output's largest value."""
    out = np.matmul(_f32(a), _f32(b))
    finite = np.isfinite(out)
    out[-1, -1] += np.float32(1e-4 * np.max(np.abs(out[finite])))
    return out.astype(a.dtype)


def zero_skip_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Skips products with a zero factor, so 0 * inf and 0 * NaN come back 0."""
    a32, b32 = _f32(a), _f32(b)
    out = np.matmul(np.where(np.isfinite(a32), a32, 0), np.where(np.isfinite(b32), b32, 0))
    for i, k in zip(*np.nonzero(~np.isfinite(a32)), strict=True):
        out[i, b32[k] != 0] = np.nan
    for k, j in zip(*np.nonzero(~np.isfinite(b32)), strict=True):
        live = a32[:, k] != 0
        out[live, j] += a32[live, k] * b32[k, j]
    return out.astype(a.dtype)


def kahan_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Compensated summation: turns a sum with an inf into NaN (inf - inf), a correct
    answer where the reference is infinite."""
    a32, b32 = _f32(a), _f32(b)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    comp = np.zeros_like(acc)
    with np.errstate(invalid="ignore"):
        for k in range(a.shape[1]):
            y = a32[:, k, None] * b32[k] - comp
            t = acc + y
            comp = (t - acc) - y
            acc = t
    return acc.astype(a.dtype)


def tf32_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 inputs rounded to TF32 (10 fraction bits, to nearest even), as a GPU does."""

    def tf32(x: np.ndarray) -> np.ndarray:
        bits = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)
        return bits.astype(np.uint32).view(np.float32)

    return np.matmul(tf32(a), tf32(b))


def lse_softmax(x: np.ndarray) -> np.ndarray:
    """exp((x - max) - log sum): the correct form the old budget rejected."""
    w = _f32(x)
    t = w - w.max(axis=-1, keepdims=True)
    return np.exp(t - np.log(np.exp(t).sum(axis=-1, keepdims=True))).astype(x.dtype)


def online_softmax(x: np.ndarray) -> np.ndarray:
    """One pass over the columns: a running max and a sum rescaled at each new max."""
    w = _f32(x)
    m = np.full((*w.shape[:-1], 1), -np.inf, np.float32)
    s = np.zeros_like(m)
    with np.errstate(invalid="ignore"):
        for j in range(w.shape[-1]):
            col = w[..., j:j + 1]
            new = np.maximum(m, col)
            scale = np.where(m == new, np.float32(1), np.exp(m - new))
            s = s * scale + np.where(col == -np.inf, np.float32(0), np.exp(col - new))
            m = new
        return (np.exp(w - m) / s).astype(x.dtype)


def eps_softmax(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    return (e / (e.sum(axis=-1, keepdims=True) + np.float32(1e-3))).astype(x.dtype)


def drop_last_softmax(x: np.ndarray) -> np.ndarray:
    """The sum stops at the last full tile of 32: at n = 4097 one term is missing."""
    w = _f32(x)
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    n = w.shape[-1] - w.shape[-1] % 32
    return (e / e[..., :n].sum(axis=-1, keepdims=True)).astype(x.dtype)


def masked_zero_softmax(x: np.ndarray) -> np.ndarray:
    """A fully masked (all -inf) row comes back zeros; the reference says NaN."""
    w = _f32(x)
    top = w.max(axis=-1, keepdims=True)
    e = np.exp(w - np.where(top == -np.inf, np.float32(0), top))
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1), 0).astype(x.dtype)


def _gate(kernel, op: str, region, **kwargs):  # type: ignore[no-untyped-def]
    return f4_gate(cand(kernel, op=op), OPS.get(op), region=region, **kwargs)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kernel", [ordered_matmul, reversed_matmul, pairwise_matmul,
                                    split_k_matmul, float64_matmul, kahan_matmul],
                         ids=lambda k: k.__name__)
@pytest.mark.parametrize("shape", [(40, 24, 4096), (33, 17, 130)], ids=str)
# the second seed doubles the cost for the same kernels: the full run only
@pytest.mark.parametrize("seed", [GATE_SEED,
                                  pytest.param(GATE_SEED + 1000, marks=pytest.mark.slow)])
def test_correct_matmul_in_any_order_passes_every_check(kernel, shape: tuple[int, int, int],  # type: ignore[no-untyped-def]
                                                        dtype: str, seed: int) -> None:
    if kernel is kahan_matmul and shape[2] > 1000:
        pytest.skip("a Python loop over K")
    report = _gate(kernel, "matmul", MatmulRegion.of(*shape, dtype), seed=seed)
    assert report.passed, report.summary()
    checked = [t for t in report.trials if t.bias or t.spread]
    assert len(checked) >= 5  # the statistical checks ran on the generated inputs
    assert all(t.bias < 1 and t.spread < 1 for t in report.trials)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kernel", [lse_softmax, online_softmax], ids=lambda k: k.__name__)
def test_every_correct_softmax_form_passes_on_every_generated_input(kernel, dtype: str) -> None:  # type: ignore[no-untyped-def]
    """The log-sum-exp form failed the old budget at 1.01x on the wide-range input, shape
    (3, 33), float32, one seed in twenty."""
    shapes = [(3, 33), (2, 3, 4097)] if kernel is lse_softmax else [(3, 33), (4, 300)]
    for shape in shapes:
        for i in range(20 if shape == (3, 33) else 2):
            report = _gate(kernel, "softmax", SoftmaxRegion.of(shape, dtype),
                           seed=GATE_SEED + 1000 * i)
            assert report.passed, report.summary()


@pytest.mark.parametrize("kernel, dtype", [
    (truncated_matmul, "bfloat16"), (truncated_matmul, "float16"),
    (scaled_matmul, "bfloat16"), (scaled_matmul, "float16"),
    (corner_matmul, "float32"),
], ids=lambda v: getattr(v, "__name__", v))
def test_errors_below_the_old_budget_fail(kernel, dtype: str) -> None:  # type: ignore[no-untyped-def]
    """Systematic errors under one rounding unit, and one element off by 1e-4 of the
    output's scale at K = 4096 in float32: all inside the old per-element budget."""
    shape = (40, 24, 4096) if kernel is corner_matmul else (64, 48, 256)
    report = _gate(kernel, "matmul", MatmulRegion.of(*shape, dtype))
    assert not report.passed and report.rejected, report.summary()
    assert report.failing is not None and report.failing.input
    assert report.failing.input in report.summary()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kernel, shape", [(eps_softmax, (64, 1000)),
                                           (drop_last_softmax, (2, 3, 4097))],
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_subtle_softmax_bugs_fail(kernel, shape: tuple[int, ...], dtype: str) -> None:  # type: ignore[no-untyped-def]
    report = _gate(kernel, "softmax", SoftmaxRegion.of(shape, dtype))
    assert not report.passed and report.rejected, report.summary()


def test_a_bias_below_the_elementwise_budget_fails_the_bias_check() -> None:
    """float32 at K = 4096: an output scaled by 1 + 1e-5 stays inside every element's bound
    (the accumulation's, some 5e-5), but over thousands of outputs the bias check sees it."""
    def slightly_scaled(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return (np.matmul(a.astype(np.float64), b.astype(np.float64)) * 1.00001).astype(
            a.dtype)

    report = _gate(slightly_scaled, "matmul", MatmulRegion.of(64, 48, 4096, "float32"))
    assert not report.passed, report.summary()
    assert "bias check" in report.reason and "away from zero" in report.reason
    assert report.failing is not None and report.failing.bias > 1.0


# -- the statistical checks on synthetic error patterns ---------------------------------------

def _model(exact: np.ndarray, sd: float, dtype: str, *, common: float = 0.0,
           group_size: int = 0):  # type: ignore[no-untyped-def]
    """An error model with a random error of scale ``sd`` (in ulps of each output) per
    output, and ``common`` (ulps) shared by each group of ``group_size`` outputs; the
    elementwise budget half an ulp plus 8 scales, as the built-in ops'."""
    ulp = dtypes_module.spacing(exact, dtype).reshape(-1)
    scales = ops_module.ErrorScales

    def at(index: np.ndarray):  # type: ignore[no-untyped-def]
        return scales(sd * ulp[index], common * ulp[index], np.zeros(index.shape))

    allowed = (0.5 + 8.0 * (sd + common)) * ulp
    return ops_module.ErrorModel(allowed.reshape(exact.shape), at, group_size)


def _exact(rng: np.random.Generator, n: int = 8192) -> np.ndarray:
    return rng.standard_normal(n) * np.exp2(rng.integers(-4, 5, n))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_statistics_pass_correct_rounding_with_model_noise(rng: np.random.Generator,
                                                           dtype: str) -> None:
    """Round to nearest of the exact value plus a random accumulated error no larger than
    the model's (in any order: an unbiased error of any shape) passes both checks."""
    exact = _exact(rng)
    ulp = dtypes_module.spacing(exact, dtype)
    for sd, noise in ((0.01, rng.standard_normal), (0.3, rng.standard_normal),
                      (20.0, rng.standard_normal),
                      (1.0, lambda n: rng.uniform(-1.7, 1.7, n))):
        got = dtypes_module.round_to(exact + sd * ulp * noise(exact.size), dtype)
        bias, spread, why = gate_module._statistics(got, exact, _model(exact, sd, dtype),
                                                    dtype, 1)
        assert not why and bias < 1 and spread < 1, (sd, bias, spread, why)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_statistics_catch_rounding_toward_zero_and_downward(rng: np.random.Generator,
                                                            dtype: str) -> None:
    exact = _exact(rng)
    model = _model(exact, 0.01, dtype)
    toward_zero = truncate(exact, dtypes_module.numpy_dtype(dtype)).astype(np.float64)
    _, _, why = gate_module._statistics(toward_zero, exact, model, dtype, 1)
    assert "bias check" in why and "toward zero" in why
    rounded = dtypes_module.round_to(exact, dtype)
    ulp = dtypes_module.spacing(exact, dtype)
    downward = np.where(rounded > exact, rounded - ulp, rounded)  # floor, in effect
    _, _, why = gate_module._statistics(downward, exact, model, dtype, 1)
    assert "bias check" in why and "downward" in why


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_statistics_catch_a_scaled_result(rng: np.random.Generator, dtype: str) -> None:
    """A relative shift of a few tenths of the model's noise, consistent over the outputs."""
    exact = _exact(rng)
    sd = 20.0 if dtype == "float32" else 0.01
    shift = 2.0 * sd * float(dtypes_module.precision(dtype).unit_roundoff) + (
        0.0 if dtype == "float32" else 1e-3)
    got = dtypes_module.round_to(exact * (1.0 + shift), dtype)
    _, _, why = gate_module._statistics(got, exact, _model(exact, sd, dtype), dtype, 1)
    assert "bias check" in why and "away from zero" in why, why


def test_statistics_catch_noise_beyond_the_model(rng: np.random.Generator) -> None:
    """Unbiased errors three times the model's scale: the spread check, not the bias one."""
    exact = _exact(rng)
    ulp = dtypes_module.spacing(exact, "float32")
    got = dtypes_module.round_to(exact + 60.0 * ulp * rng.standard_normal(exact.size),
                                 "float32")
    bias, spread, why = gate_module._statistics(got, exact, _model(exact, 20.0, "float32"),
                                                "float32", 1)
    assert "spread check" in why and bias < 1 and spread > 1, (bias, spread, why)


def test_statistics_allow_a_shared_error_per_group_but_not_the_same_one_everywhere(
        rng: np.random.Generator) -> None:
    """A softmax row's sum errs by one relative amount for the whole row: random from row to
    row it passes; the same in every row (an epsilon in the denominator) it fails."""
    rows, n = 64, 512
    exact = np.abs(_exact(rng, rows * n)).reshape(rows, n)
    u = float(dtypes_module.precision("float32").unit_roundoff)
    model = _model(exact, 1.0, "float32", common=50.0, group_size=n)
    random_rows = exact * (1.0 + 50.0 * u * rng.standard_normal((rows, 1)))
    _, _, why = gate_module._statistics(
        dtypes_module.round_to(random_rows, "float32"), exact, model, "float32", 1)
    assert not why, why
    same = dtypes_module.round_to(exact * (1.0 - 200.0 * u), "float32")
    _, _, why = gate_module._statistics(same, exact, model, "float32", 1)
    assert "bias check" in why and "toward zero" in why, why


def test_duplicate_outputs_count_once(rng: np.random.Generator) -> None:
    """A thousand copies of one exact value rounded the same way are one observation: a
    correct kernel that rounds them up together is not biased."""
    exact = np.concatenate([np.full(4000, 1.0 + 2.0 ** -9 + 2.0 ** -12), _exact(rng, 200)])
    got = dtypes_module.round_to(exact, "bfloat16")
    got[:4000] = 1.0 + 2.0 ** -7  # the other neighbour: still within an ulp, same for all
    model = _model(exact, 0.5, "bfloat16")
    bias, _, why = gate_module._statistics(got, exact, model, "bfloat16", 1)
    assert not why and bias < 1, why


# -- generated inputs, NaN and inf ------------------------------------------------------------

def test_generated_inputs_cover_tails_offsets_specials_and_name_themselves() -> None:
    matmul = OPS.get("matmul").gate_inputs(MatmulRegion.of(256, 256, 4096, "float16"), 7)
    names = matmul.names  # type: ignore[attr-defined]
    assert len(names) == len(matmul)
    tails = [t for t, name in zip(matmul, names, strict=True) if "tails" in name]
    dims = {(a.shape[0] % 128, b.shape[1] % 128, a.shape[1] % 128) for a, b in tails}
    assert dims == {(127, 1, 127), (1, 127, 73)}
    special = next(t for t, name in zip(matmul, names, strict=True) if "special" in name)
    a, b = (x.astype(np.float64) for x in special)
    assert np.isnan(a).any() and np.isposinf(b).any() and np.isneginf(b).any()
    assert not a[0].any() and not b[:, 0].any()
    tiny = np.abs(a[np.isfinite(a) & (a != 0)])
    assert (tiny < np.finfo(np.float16).smallest_normal).any()
    assert any("offset" in name for name in names)
    softmax = OPS.get("softmax").gate_inputs(SoftmaxRegion.of((3, 33), "float32"), 7)
    special = next(t for t, name in zip(softmax, softmax.names, strict=True)  # type: ignore[attr-defined]
                   if "special" in name)[0]
    assert np.isnan(special).any() and np.isposinf(special).any()
    assert (np.isneginf(special).all(axis=-1)).any()  # a fully masked row


def test_a_nan_that_should_propagate_must(rng: np.random.Generator) -> None:
    report = _gate(zero_skip_matmul, "matmul", MatmulRegion.of(24, 16, 40, "float32"))
    assert not report.passed
    assert "not NaN where the reference is NaN" in report.reason, report.summary()
    assert report.failing is not None and "special values" in report.failing.input
    masked = _gate(masked_zero_softmax, "softmax", SoftmaxRegion.of((4, 300), "float16"))
    assert not masked.passed and "not NaN where the reference is NaN" in masked.reason


def test_nan_where_the_reference_is_infinite_is_allowed() -> None:
    """Compensated summation turns inf - inf into NaN: right where the reference is inf."""
    report = _gate(kahan_matmul, "matmul", MatmulRegion.of(24, 16, 40, "float32"))
    assert report.passed, report.summary()


def test_an_overflow_to_inf_where_rounding_overflows_is_right() -> None:
    a = np.full((2, 2), 200.0, np.float16)
    report = f4_gate(cand(float64_matmul), OPS.get("matmul"), inputs=(a, a))
    assert report.trials[0].status == "pass", report.summary()


def test_structured_dispatch_inputs_get_the_elementwise_budget_only() -> None:
    """Equal outputs from equal rows round alike in a correct kernel: no bias check there."""
    a = np.full((64, 128), 0.1, np.float32)
    b = np.ones((128, 48), np.float32)
    report = f4_gate(cand(ordered_matmul), OPS.get("matmul"), inputs=(a, b))
    assert report.trials[0].status == "pass" and report.trials[0].bias == 0.0
    assert report.passed, report.summary()


def test_a_user_op_with_a_wider_reference_gets_half_an_ulp(rng: np.random.Generator) -> None:
    def axpy_ref(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return 3.0 * x.astype(np.float64) + y.astype(np.float64)

    the_op = make_op("axpy_rounding_test", axpy_ref)
    x = rng.standard_normal(2000).astype(ops_module.numpy_dtype("bfloat16"))
    y = rng.standard_normal(2000).astype(x.dtype)
    good = f4_gate(cand(lambda x, y: (3 * _f32(x) + _f32(y)).astype(x.dtype),
                        op=the_op.name, name="good"), the_op, inputs=(x, y))
    truncating = f4_gate(cand(lambda x, y: truncate(axpy_ref(x, y), x.dtype),
                              op=the_op.name, name="trunc"), the_op, inputs=(x, y))
    assert good.passed, good.summary()
    assert not truncating.passed and "exceeds the allowed" in truncating.reason


# -- the TF32 policy ---------------------------------------------------------------------------

@pytest.fixture
def tf32_reset() -> Iterator[None]:
    yield
    ops_module.allow_tf32("matmul", "float32", allow=False)


def test_tf32_is_rejected_by_default_and_accepted_once_allowed(tf32_reset: None) -> None:
    region = MatmulRegion.of(65, 33, 512, "float32")
    assert not _gate(tf32_matmul, "matmul", region).passed
    ops_module.allow_tf32("matmul", "float32")
    assert "float32" in OPS.get("matmul").allow_tf32
    report = _gate(tf32_matmul, "matmul", region)
    assert report.passed, report.summary()
    assert "TF32" in report.budget
    assert not _gate(scaled_matmul, "matmul", MatmulRegion.of(65, 33, 512, "float16")).passed
    ops_module.allow_tf32("matmul", "float32", allow=False)
    assert not _gate(tf32_matmul, "matmul", region).passed


def test_tf32_is_a_float32_matmul_choice(tf32_reset: None) -> None:
    with pytest.raises(ValueError, match="float32"):
        ops_module.allow_tf32("matmul", "float16")
    with pytest.raises(ValueError, match="TF32 budget"):
        ops_module.allow_tf32("softmax", "float32")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_flushing_float32_subnormals_is_tolerated(dtype: str) -> None:
    """A GPU kernel compiled with flush-to-zero loses float32 subnormals: allowed, and its
    outputs near zero are not taken for a bias toward zero."""
    def flushing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a32, b32 = _f32(a), _f32(b)
        a32[np.abs(a32) < np.finfo(np.float32).smallest_normal] = 0.0
        out = np.matmul(a32, b32)
        out[np.abs(out) < np.finfo(np.float32).smallest_normal] = 0.0
        return out.astype(a.dtype)

    report = _gate(flushing, "matmul", MatmulRegion.of(48, 40, 96, dtype))
    assert report.passed, report.summary()
    fp16 = _gate(flushing, "matmul", MatmulRegion.of(48, 40, 96, "float16"))
    assert fp16.passed  # float16 subnormals are float32 normals: nothing flushed


def test_flushing_float16_subnormal_results_fails() -> None:
    def flushing(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.matmul(_f32(a), _f32(b))
        out[np.abs(out) < np.finfo(np.float16).smallest_normal] = 0.0
        return out.astype(a.dtype)

    report = _gate(flushing, "matmul", MatmulRegion.of(48, 40, 96, "float16"))
    assert not report.passed and report.failing is not None
    assert "special values" in report.failing.input, report.summary()


def test_the_frames_order_is_lexsorts_by_group_then_value(rng: np.random.Generator) -> None:
    """The statistical frame orders its outputs by group, then value, ties (equal values,
    a zero and a negative zero) in place: as ``np.lexsort`` did."""
    for size, group in ((1, 1), (40, 7), (1200, 300), (2048, 2048)):
        index = np.sort(rng.choice(4 * size, size, replace=False))
        values = rng.choice([-1.5, -0.0, 0.0, 2.0 ** -140, 1.0, 3.25], size)
        values[::5] = rng.standard_normal(values[::5].size)
        groups = index // group
        order = gate_module._by_group_then_value(groups, values)
        assert order.tolist() == np.lexsort((values, groups)).tolist()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_frame_holds_the_plain_formulas_values_bit_for_bit(
        rng: np.random.Generator, dtype: str) -> None:
    """The statistical frame, however it is computed, is the plain definition's: every
    STAT_SAMPLE-th output (finite, clear of the flush), sorted by row then value, the
    outputs equal in one row one unit with the largest of their scales, in ulp."""
    from pytest_arbiter.core.dtypes import round_to, spacing
    from pytest_arbiter.core.ops.softmax import _softmax_exact, softmax_model

    x = rng.standard_normal((12, 400)).astype(np.float32)
    x[0, :60] = x[0, 0]  # ties in one row: units of several outputs
    x[3, :] = 0.0
    x[5, 7] = -np.inf
    exact = _softmax_exact(x)
    model = softmax_model([x], exact, generated=True)
    frame = gate_module._frame(exact.reshape(-1), None, model, dtype, 5)

    flat = exact.reshape(-1)
    stride = -(-flat.size // gate_module.STAT_SAMPLE)
    index = np.arange(5 % stride, flat.size, stride)
    finite = np.isfinite(flat[index])
    index = index[finite]
    index = index[spacing(flat[index], dtype) >= 64.0 * model.flush]
    order = np.lexsort((flat[index], index // model.group_size))
    index = index[order]
    e = flat[index]
    ulp = spacing(e, dtype)
    for got, want in ((frame.index, index), (frame.e, e), (frame.ulp, ulp),
                      (frame.ideal, round_to(e, dtype))):
        assert got.tobytes() == want.tobytes()
    rows = index // model.group_size
    new_unit = np.concatenate(([True], (e[1:] != e[:-1]) | (rows[1:] != rows[:-1])))
    starts = np.flatnonzero(new_unit)
    scales = model.scales(index)
    for field, values in (("sd", scales.sd), ("common", scales.common),
                          ("systematic", scales.systematic),
                          ("bound", model.allowed.reshape(-1)[index])):
        want = np.array([np.max(values[a:b] / ulp[a:b])
                         for a, b in zip(starts, [*starts[1:], e.size], strict=True)])
        assert getattr(frame.units, field).tobytes() == want.tobytes(), field
    assert frame.units.group.tolist() == rows[starts].tolist()
    assert frame.starts is not None and frame.starts.tolist() == starts.tolist()


def test_a_trial_says_in_a_typed_field_whether_accepts_turned_it_down() -> None:
    """``accepts_false`` tells a refusal through ``accepts()`` from a ``Decline`` raised
    by the run (``gate_case`` skips on the first only), without reading the reason."""
    region = SoftmaxRegion.of((4, 24), "float32")
    op = OPS.get("softmax")

    def declines(x: np.ndarray) -> np.ndarray:
        raise Decline("not this layout")

    refusing = FunctionCandidate(np.exp, "refusing", "softmax", "cpu", 0,
                                 lambda x: False, None)
    raising = FunctionCandidate(declines, "raising", "softmax", "cpu", 0, None, None)
    by_accepts = f4_gate(refusing, op, region=region)
    by_decline = f4_gate(raising, op, region=region)
    assert by_accepts.trials and all(t.status == "declined" and t.accepts_false
                                     for t in by_accepts.trials)
    assert by_decline.trials and all(t.status == "declined" and not t.accepts_false
                                     for t in by_decline.trials)
