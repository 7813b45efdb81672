"""The built-in ``matmul`` op: 2-D A (MxK) @ B (KxN); its validation, reference, error
model (docs/accuracy.md, "matmul") and generated gate inputs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pytest_arbiter.core.dtypes import dtype_name, numpy_dtype, precision
from pytest_arbiter.core.ops.accuracy import (
    ERROR_LAMBDA,
    TF32_UNIT_ROUNDOFF,
    ErrorModel,
    ErrorScales,
    finite_or_zero,
    with_rounding,
)
from pytest_arbiter.core.ops.arrays import (
    Array,
    builtin_dtype,
    cast,
    like,
    require_array,
    shape_of,
    to_host,
)
from pytest_arbiter.core.ops.definition import Op
from pytest_arbiter.core.ops.gate_inputs import (
    TAILS,
    GateInputs,
    draw_dtype,
    ragged_dim,
    reduced_k,
    tail_dim,
)
from pytest_arbiter.core.regions import MatmulRegion, Region


def _validate_matmul(*inputs: Array) -> None:
    if len(inputs) != 2:
        raise ValueError(f"matmul takes two arrays (A, B), got {len(inputs)}")
    a, b = inputs
    require_array(a, "matmul A")
    require_array(b, "matmul B")
    both = f"A is {shape_of(a)}, B is {shape_of(b)}"
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul needs 2-D A (MxK) and B (KxN): {both}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul contraction mismatch: A is {shape_of(a)} (K={a.shape[1]}) but "
            f"B is {shape_of(b)} (K={b.shape[0]})"
        )
    if a.dtype != b.dtype:
        raise ValueError(f"matmul dtypes differ: A is {shape_of(a)} {a.dtype}, "
                         f"B is {shape_of(b)} {b.dtype}")
    builtin_dtype("matmul", a)


def _matmul_region(a: Array, b: Array) -> MatmulRegion:
    return MatmulRegion.of(int(a.shape[0]), int(b.shape[1]), int(a.shape[1]),
                           dtype_name(a.dtype))


def _matmul_exact(a: Array, b: Array) -> np.ndarray:
    return np.matmul(to_host(a).astype(np.float64), to_host(b).astype(np.float64))


def _matmul_reference(a: Array, b: Array) -> Array:
    return like(_matmul_exact(a, b).astype(a.dtype), a)


def _smallest_nonzero(x: np.ndarray) -> float:
    """The smallest nonzero entry of ``x`` (non-negative, finite); inf when none is. The
    plain minimum where no entry is zero (the usual case), a masked one otherwise."""
    low = float(x.min(initial=np.inf))
    return low if low > 0.0 else float(np.min(x, initial=np.inf, where=x > 0))


def _magnitude_product(a: np.ndarray, b: np.ndarray, power: int) -> np.ndarray:
    """``|A|^p @ |B|^p`` (elementwise powers 1 or 2; non-finite entries as 0): the
    magnitudes behind a bound, rounded up.

    In float32 (twice as fast, and no float64 copies of the inputs) unless a nonzero
    entry lies outside [2^-25, 2^25] or K is over 2^20, where a product of squares or a
    sum could overflow or go subnormal; float32's relative error, below ``(K + 2) 2^-24``,
    is covered by the factor.
    """
    k = a.shape[1]
    x, y = (np.abs(np.asarray(v, dtype=np.float32 if v.dtype.itemsize <= 4 else None))
            for v in (a, b))
    # |x|'s largest is finite exactly when every entry is (a NaN or inf wins the max)
    top = max(float(x.max(initial=0.0)), float(y.max(initial=0.0)))
    if not math.isfinite(top):
        x, y = (np.where(np.isfinite(v), v, 0.0).astype(v.dtype) for v in (x, y))
        top = max(float(x.max(initial=0.0)), float(y.max(initial=0.0)))
    low = min(_smallest_nonzero(x), _smallest_nonzero(y))
    if top > 2.0 ** 25 or low < 2.0 ** -25 or k > 1 << 20 or x.dtype != np.float32:
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        out: np.ndarray = np.matmul(x64 ** power, y64 ** power)
        return out * (1.0 + 2.0 * (k + 2) * 2.0 ** -53)
    fast = np.matmul(x ** power, y ** power).astype(np.float64)
    return fast * (1.0 + 2.0 * (k + 2) * 2.0 ** -24)


def matmul_model(inputs: Sequence[np.ndarray], exact: np.ndarray, *, generated: bool,
                  tf32: bool = False) -> ErrorModel:
    """matmul's error model: a K-term inner product accumulated in ``u_acc`` in any order.

    ``generated``: the gate drew the inputs, so along K the products of every output are
    independent and identically distributed, and the sharper random-data bound holds
    (docs/accuracy.md, "matmul"); otherwise the worst-case-data bound of Higham & Mary.
    """
    a, b = inputs[0], inputs[1]
    dtype = a.dtype
    p = precision(dtype)
    k = a.shape[1]
    u_acc = p.accumulate_unit_roundoff
    magnitude = np.abs(finite_or_zero(exact))
    tf32 = tf32 and p.name == "float32"
    # the products of 16-bit inputs are exact in a float32 accumulator; wider ones round
    rounded_products = 1.0 if p.name in ("float32", "float64") else 0.0
    flush = (2.0 * k + 1.0) * p.accumulate_smallest_normal
    t = TF32_UNIT_ROUNDOFF if tf32 else 0.0
    if generated:
        # node sums of any summation tree = their share of C_ij plus a bridge of the
        # centred products: ||S|| <= sqrt(K/3) |C_ij| + sqrt(K Q_ij) (docs/accuracy.md);
        # TF32 inputs (rounded or truncated to 10 fraction bits) shift C_ij by at most
        # 2 u_tf32 |C_ij| and add a random part of scale 2 u_tf32 sqrt(Q_ij)
        q = np.sqrt(_magnitude_product(a, b, 2))
        sd = u_acc * math.sqrt(k / 3.0 + 1.0) * magnitude + (
            u_acc * (math.sqrt(k) + rounded_products) + 2.0 * t) * q
        accumulated = ERROR_LAMBDA * sd + 2.0 * t * magnitude

        def scales(index: np.ndarray) -> ErrorScales:
            return ErrorScales(sd.reshape(-1)[index], np.zeros(index.shape),
                               2.0 * t * magnitude.reshape(-1)[index])
    else:
        m = _magnitude_product(a, b, 1)
        # |a~ b~ - a b| <= (4 u_tf32 + 4 u_tf32^2) |a||b| for TF32, truncation included
        accumulated = (min(float(k), ERROR_LAMBDA * math.sqrt(k)) * u_acc
                       + 4.0 * t * (1.0 + t)) * m

        def scales(index: np.ndarray) -> ErrorScales:
            return ErrorScales(accumulated.reshape(-1)[index] / ERROR_LAMBDA,
                               np.zeros(index.shape), np.zeros(index.shape))
    return ErrorModel(with_rounding(magnitude, accumulated, flush, dtype), scales,
                      flush=flush)


def matmul_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    return matmul_model(inputs, exact, generated=False).allowed


def matmul_budget_tf32(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    return matmul_model(inputs, exact, generated=False, tf32=True).allowed


def _matmul_gate_inputs(region: Region, seed: int) -> GateInputs:
    assert isinstance(region, MatmulRegion)
    m, n, k, dtype = region.m, region.n, region.k, region.dtype
    out = GateInputs()
    if m == 0 or n == 0:
        # an empty product: no value to check, and no trial of its shape to build; the
        # dispatch's own inputs check the output's shape and dtype (K = 0 is no such
        # case: its output is M x N zeros, and the trials below check them)
        return out
    small = numpy_dtype(dtype).itemsize == 2
    scale_exp = 3 if small else 8
    offset = 4.0 if small else 16.0
    draw = draw_dtype(dtype)

    def pair(name: str, a: np.ndarray, b: np.ndarray) -> None:
        out.add(name, cast(a, dtype), cast(b, dtype))

    def normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        return rng.standard_normal(shape, dtype=draw)

    rng = np.random.default_rng(seed)
    pair("N(0, 1), the region's shape", normal(rng, (m, k)), normal(rng, (k, n)))
    # all-positive sums grow steadily, so a low-precision accumulator stagnates
    rng = np.random.default_rng(seed + 1)
    pair("all-positive U[0, 1): a narrow accumulator stagnates",
         rng.random((m, k), dtype=draw), rng.random((k, n), dtype=draw))
    rng = np.random.default_rng(seed + 2)
    tm, tn, tk = ragged_dim(m), ragged_dim(n), ragged_dim(k)
    pair("ragged neighbour: every even dimension + 1", normal(rng, (tm, tk)),
         normal(rng, (tk, tn)))
    rng = np.random.default_rng(seed + 3)
    a = normal(rng, (m, k)) * np.exp2(rng.integers(-scale_exp, scale_exp + 1, (m, 1)))
    b = normal(rng, (k, n)) * np.exp2(rng.integers(-scale_exp, scale_exp + 1, (1, n)))
    pair(f"mixed magnitudes: rows of A, columns of B scaled by 2^+-{scale_exp}", a, b)
    for j, tails in enumerate(TAILS):
        tm, tn, tk = (tail_dim(d, r) for d, r in zip((m, n, k), tails, strict=True))
        rng = np.random.default_rng(seed + 4 + j)
        pair(f"ragged tails {tm}x{tn}x{tk}: M, N, K past multiples of 8 to 128",
             normal(rng, (tm, tk)), normal(rng, (tk, tn)))
    ks = reduced_k(k)
    rng = np.random.default_rng(seed + 6)
    pair(f"large offset ({m}x{ks}x{n}): A = {offset:g} + N(0, 1), B = N(0, 1): the "
         "partial sums dwarf C", offset + normal(rng, (m, ks)), normal(rng, (ks, n)))
    # special values: a zero row of A and column of B, a NaN in A and +-inf in B (so 0 * inf
    # and NaN must propagate as the reference says), and A's odd middle rows (else B's
    # middle columns) scaled into the subnormal range
    rng = np.random.default_rng(seed + 7)
    tiny_exp = int(math.log2(precision(dtype).smallest_normal)) - 4
    a = rng.standard_normal((m, ks))
    b = normal(rng, (ks, n)).astype(np.float64)
    if m >= 3:
        a[1:m - 1:2] *= 2.0 ** tiny_exp
    elif n >= 3:
        b[:, 1:n - 1:2] *= 2.0 ** tiny_exp
    a[0, :] = 0.0
    b[:, 0] = 0.0
    if ks:
        b[ks // 2, n - 1] = np.inf  # 0 * inf in A's zero row: the reference says NaN
        b[(ks - 1) // 3, max(n - 2, 0)] = -np.inf
        a[m - 1, (2 * ks) // 3] = np.nan
    pair(f"special values ({m}x{ks}x{n}): a zero row of A and column of B, a NaN in A, "
         f"+inf and -inf in B, subnormal rows (x 2^{tiny_exp})", a, b)
    return out


def matmul_op() -> Op:
    """The built-in ``matmul``."""
    return Op("matmul", _matmul_reference, _validate_matmul, _matmul_region, _matmul_exact,
              matmul_budget, _matmul_gate_inputs, builtin=True,
              doc="2-D matrix product: A (MxK) @ B (KxN)")
