"""The built-in ops' error models hold the plain formulas' values bit for bit, on finite
inputs and on the special values' rows alike, however few passes over the inputs they
take (docs/accuracy.md, "matmul" and "softmax")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_arbiter.core.dtypes import numpy_dtype
from pytest_arbiter.core.ops.accuracy import ERROR_LAMBDA, with_rounding
from pytest_arbiter.core.ops.matmul import _magnitude_product, _smallest_nonzero
from pytest_arbiter.core.ops.softmax import _records_bound, _softmax_exact, softmax_model


def _plain_magnitude(a: np.ndarray, b: np.ndarray, power: int) -> np.ndarray:
    """``|A|^p @ |B|^p`` by the definition: a pass for the finite entries, one for each
    extreme, the float32 product only where every nonzero entry is in [2^-25, 2^25]."""
    k = a.shape[1]
    x, y = (np.abs(np.asarray(v, dtype=np.float32 if v.dtype.itemsize <= 4 else None))
            for v in (a, b))
    if not (bool(np.isfinite(x).all()) and bool(np.isfinite(y).all())):
        x, y = (np.where(np.isfinite(v), v, 0.0).astype(v.dtype) for v in (x, y))
    top = max(float(x.max(initial=0.0)), float(y.max(initial=0.0)))
    low = min(float(np.min(x, initial=np.inf, where=x > 0)),
              float(np.min(y, initial=np.inf, where=y > 0)))
    if top > 2.0 ** 25 or low < 2.0 ** -25 or x.dtype != np.float32:
        out: np.ndarray = np.matmul(x.astype(np.float64) ** power,
                                    y.astype(np.float64) ** power)
        return out * (1.0 + 2.0 * (k + 2) * 2.0 ** -53)
    fast = np.matmul(x ** power, y ** power).astype(np.float64)
    return fast * (1.0 + 2.0 * (k + 2) * 2.0 ** -24)


def _operands(rng: np.random.Generator, dtype: str) -> list[tuple[np.ndarray, np.ndarray]]:
    want = numpy_dtype(dtype)
    a, b = rng.standard_normal((9, 17)), rng.standard_normal((17, 5))
    zeros, special, tiny, huge = a.copy(), a.copy(), a.copy(), a.copy()
    zeros[2] = 0.0
    special[1, 3], special[4, 4] = np.nan, -np.inf
    tiny[3] *= 2.0 ** -30
    huge[0, 0] = 2.0 ** 40
    return [(v.astype(want), b.astype(want)) for v in (a, zeros, special, tiny, huge)] + [
        (np.zeros((3, 0), dtype=want), np.zeros((0, 4), dtype=want))]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_the_magnitude_product_is_the_plain_definitions(rng: np.random.Generator,
                                                         dtype: str) -> None:
    with np.errstate(all="ignore"):
        for a, b in _operands(rng, dtype):
            for power in (1, 2):
                got, want = _magnitude_product(a, b, power), _plain_magnitude(a, b, power)
                assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_the_smallest_nonzero_entry_skips_zeros() -> None:
    assert _smallest_nonzero(np.array([3.0, 0.5, 2.0], dtype=np.float32)) == 0.5
    assert _smallest_nonzero(np.array([0.0, 0.25, 0.0, 4.0])) == 0.25
    assert _smallest_nonzero(np.zeros(4)) == math.inf
    assert _smallest_nonzero(np.zeros(0)) == math.inf


def _plain_softmax_terms(x32: np.ndarray, exact: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The model's per-row and per-output terms by the definition: ``|y|``, the distance
    to the row's largest finite x, the row's finite range, log s (0 where not finite)."""
    x = x32.astype(np.float64)
    y = np.abs(exact)
    finite = np.isfinite(x)
    top = np.max(np.where(finite, x, -np.inf), axis=-1, keepdims=True)
    span = top - np.min(np.where(finite, x, np.inf), axis=-1, keepdims=True)
    top, span = (np.where(np.isfinite(top), v, 0.0) for v in (top, span))
    t = np.where(finite, top - x, 0.0)
    y = np.where(np.isfinite(y), y, 0.0)
    with np.errstate(divide="ignore"):
        log_total = -np.log(y.max(axis=-1, keepdims=True))
    log_total = np.where(np.isfinite(log_total), np.maximum(log_total, 0.0), 0.0)
    return y, t, span, log_total


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("special", [False, True])
def test_the_softmax_model_is_the_plain_definitions(rng: np.random.Generator, dtype: str,
                                                    special: bool) -> None:
    """Finite rows take the fast path (the rows' extremes show no NaN or infinity); a
    NaN, +inf, -inf or fully masked row anywhere takes the masked one: the same values."""
    x = (rng.standard_normal((7, 45)) * 3.0).astype(numpy_dtype(dtype))
    if special:
        x[1, 3], x[2, 5], x[3, 7], x[4] = np.nan, np.inf, -np.inf, -np.inf
    with np.errstate(all="ignore"):
        exact = _softmax_exact(x)
        model = softmax_model([x], exact, generated=True)
        y, t, span, log_total = _plain_softmax_terms(x, exact)
        # the scales at every output read the same terms the budget was made of
        index = np.arange(exact.size)
        scales = model.scales(index)
    n, u_acc = x.shape[-1], 2.0 ** -24
    shared = math.sqrt(n) + 5.0 + 5.0 * math.sqrt(_records_bound(n, True))
    relative = t * 2.0
    relative += 8.0 + ERROR_LAMBDA * shared + 2.0 * log_total + span
    relative *= u_acc
    allowed = with_rounding(y, relative * y, model.flush, dtype)
    at, rows = y.reshape(-1), index // n
    argument = 2.0 * t.reshape(-1) + 2.0 * log_total.reshape(-1)[rows]
    for got, want in ((model.allowed, allowed),
                      (scales.sd, u_acc * (4.0 + argument) * at),
                      (scales.common, u_acc * (shared + span.reshape(-1)[rows]) * at),
                      (scales.systematic, 8.0 * u_acc * at)):
        assert got.tobytes() == want.tobytes()
    assert special == (not bool(np.isfinite(exact).all()))
