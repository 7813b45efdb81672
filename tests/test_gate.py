"""The F4 gate: every correct kernel passes for every dtype; each kind of wrong one fails."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_arbiter import Decline, MatmulRegion, SoftmaxRegion, f4_gate
from pytest_arbiter.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.dtypes import DTYPE_NAMES
from pytest_arbiter.ops import OPS, make_op

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
    assert len(report.trials) == 5


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
    assert len(good.trials) == 1
