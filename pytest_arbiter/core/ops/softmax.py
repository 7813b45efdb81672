"""The built-in ``softmax`` op, along the last axis: its validation, reference, error model
(docs/accuracy.md, "softmax") and generated gate inputs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pytest_arbiter.core.dtypes import dtype_name, numpy_dtype, precision
from pytest_arbiter.core.ops.accuracy import ERROR_LAMBDA, ErrorModel, ErrorScales, with_rounding
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
from pytest_arbiter.core.ops.gate_inputs import TAILS, GateInputs, draw_dtype, ragged_dim, tail_dim
from pytest_arbiter.core.regions import Region, SoftmaxRegion


def _validate_softmax(*inputs: Array) -> None:
    if len(inputs) != 1:
        raise ValueError(f"softmax takes one array, got {len(inputs)}")
    (x,) = inputs
    require_array(x, "softmax input")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"softmax needs an array with a non-empty last axis, got {shape_of(x)}")
    builtin_dtype("softmax", x)


def _softmax_region(x: Array) -> SoftmaxRegion:
    return SoftmaxRegion.of(tuple(int(d) for d in x.shape), dtype_name(x.dtype))


def _softmax_exact(x: Array) -> np.ndarray:
    x64 = to_host(x).astype(np.float64)
    shifted = x64 - x64.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def _softmax_reference(x: Array) -> Array:
    return like(_softmax_exact(x).astype(x.dtype), x)


def _records_bound(n: int, generated: bool) -> int:
    """How often a running maximum may rise along a row (an online softmax rescales its sum
    each time): any number for arbitrary data; for i.i.d. data (the gate's own) the count
    of records, mean H_n, stays below 3 H_n + 14 but with probability < 1e-12 (Chernoff)."""
    if not generated or n < 2:
        return max(n - 1, 0)
    harmonic = math.log(n) + 0.5772156649 + 1.0 / (2 * n)
    return min(n - 1, math.ceil(3.0 * harmonic + 14.0))


def softmax_model(inputs: Sequence[np.ndarray], exact: np.ndarray, *,
                   generated: bool) -> ErrorModel:
    """softmax's error model, for the two-pass, log-sum-exp and online forms alike.

    Per element (relative): the exponent's argument ``x_i - max`` (and ``- log s`` in the
    log-sum-exp form) is rounded twice, ``exp`` and the division err by a few ulps; shared
    by a row (relative): the sum's n additions and an online form's rescalings, and the
    rounding of each rescaling's argument (at most the row's range in all).
    """
    x = np.asarray(inputs[0], dtype=np.float64)
    dtype = inputs[0].dtype
    p = precision(dtype)
    n = x.shape[-1]
    u_acc = p.accumulate_unit_roundoff
    y = np.abs(exact)
    top = x.max(axis=-1, keepdims=True)
    bottom = x.min(axis=-1, keepdims=True)
    peak = y.max(axis=-1, keepdims=True)
    # a NaN or an infinity wins a row's max or min: the rows' extremes say whether x and
    # y are finite everywhere, without a pass over each
    if np.isfinite(top).all() and np.isfinite(bottom).all() and np.isfinite(peak).all():
        span = top - bottom
        t = top - x
    else:
        finite = np.isfinite(x)
        top = np.max(np.where(finite, x, -np.inf), axis=-1, keepdims=True)
        span = top - np.min(np.where(finite, x, np.inf), axis=-1, keepdims=True)
        top, span = (np.where(np.isfinite(top), v, 0.0) for v in (top, span))
        t = np.where(finite, top - x, 0.0)
        y = np.where(np.isfinite(y), y, 0.0)
        peak = y.max(axis=-1, keepdims=True)
    # the row's sum s = exp(0) / y at its maximum: log s without another exp (a row whose
    # largest y is 0 gets -log 0 = inf, then 0, as every non-finite log s does)
    log_total = np.negative(np.log(peak, out=np.full(peak.shape, -np.inf), where=peak > 0))
    log_total = np.where(np.isfinite(log_total), np.maximum(log_total, 0.0), 0.0)
    shared = math.sqrt(n) + 5.0 + 5.0 * math.sqrt(_records_bound(n, generated))
    # relative: u_acc (8 + 2 |x - max| + 2 log s + 8 shared + range), in place
    relative = t * 2.0
    relative += 8.0 + ERROR_LAMBDA * shared + 2.0 * log_total + span
    relative *= u_acc
    flush = 2.0 * p.accumulate_smallest_normal
    allowed = with_rounding(y, relative * y, flush, dtype)

    def scales(index: np.ndarray) -> ErrorScales:
        row = index // max(n, 1)
        at = y.reshape(-1)[index]
        argument = 2.0 * t.reshape(-1)[index] + 2.0 * log_total.reshape(-1)[row]
        return ErrorScales(u_acc * (4.0 + argument) * at,
                           u_acc * (shared + span.reshape(-1)[row]) * at,
                           8.0 * u_acc * at)

    return ErrorModel(allowed, scales, group_size=n, flush=flush)


def _softmax_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    return softmax_model(inputs, exact, generated=False).allowed


def _softmax_gate_inputs(region: Region, seed: int) -> GateInputs:
    assert isinstance(region, SoftmaxRegion)
    shape, dtype = region.shape, region.dtype
    if 0 in shape:
        # no rows: no value to check, and no trial of its shape to build; the dispatch's
        # own inputs check the output's shape and dtype
        return GateInputs()
    n, lead = shape[-1], shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    offset = 3000.0 if numpy_dtype(dtype).itemsize == 2 else 1000.0
    ragged = (*shape[:-1], ragged_dim(shape[-1])) if len(shape) == 1 else (
        ragged_dim(shape[0]), *shape[1:-1], ragged_dim(shape[-1]))
    # the tails are about the last axis: a few rows do
    inner = int(np.prod(lead[1:], dtype=np.int64))
    tail_lead = lead if rows <= 8 else (max(1, 8 // max(inner, 1)), *lead[1:])
    draw = draw_dtype(dtype)
    out = GateInputs()

    def one(name: str, x: np.ndarray) -> None:
        out.add(name, cast(x, dtype))

    def normal(rng: np.random.Generator, dims: tuple[int, ...], scale: float) -> np.ndarray:
        return rng.standard_normal(dims, dtype=draw) * scale

    rng = np.random.default_rng(seed)
    one("N(0, 3^2), the region's shape", normal(rng, shape, 3.0))
    # a large offset overflows exp() in a kernel that skips the max; a different offset
    # per row underflows the low rows of one that takes the max over the whole array
    rng = np.random.default_rng(seed + 1)
    row_index = np.arange(rows).reshape(*lead, 1) % 16
    one(f"large offsets: N(0, 3^2) + {offset:g} + 64 x (row % 16)",
        normal(rng, shape, 3.0) + offset + 64.0 * row_index)
    rng = np.random.default_rng(seed + 2)
    one("ragged neighbour (rows and last axis + 1 when even), wide range N(0, 20^2): "
        "many outputs underflow", normal(rng, ragged, 20.0))
    for j, tails in enumerate(TAILS):
        rng = np.random.default_rng(seed + 3 + j)
        tail = tail_dim(n, tails[0])
        one(f"ragged tail: last axis {tail}, past multiples of 8 to 128",
            normal(rng, (*tail_lead, tail), 3.0))
    # special rows, then rows with about 1 in 4 entries masked (-inf)
    rng = np.random.default_rng(seed + 5)
    special_lead = lead if rows >= 6 else (-(-6 // max(inner, 1)), *lead[1:]) if lead else (6,)
    x = normal(rng, (*special_lead, n), 3.0)
    flat = x.reshape(-1, n)
    flat[5:][rng.random(flat[5:].shape) < 0.25] = -np.inf
    flat[0] = normal(rng, (n,), 1.0)
    flat[0, n // 2] = 30.0
    flat[1] = 0.0
    flat[2, n // 3] = np.nan
    flat[3, (2 * n) // 3] = np.inf
    flat[4] = -np.inf
    one("special rows: a spike of +30, a constant row, a NaN, a +inf, all -inf "
        "(reference: NaN rows), then rows about 1 in 4 masked (-inf)", x)
    return out


def softmax_op() -> Op:
    """The built-in ``softmax``."""
    return Op("softmax", _softmax_reference, _validate_softmax, _softmax_region,
              _softmax_exact, _softmax_budget, _softmax_gate_inputs, builtin=True,
              doc="softmax along the last axis")
