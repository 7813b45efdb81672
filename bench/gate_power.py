"""Gate power: the buggy kernels the F4 gate catches and the correct ones it rejects, beside
the tolerance checks engineers use today.

Each kernel runs on the F4 gate's own inputs for a region (for the user op, on seeded
dispatch inputs) and is judged by three checkers side by side:

* ``F4``: :func:`pytest_arbiter.f4_gate`, this tree's gate;
* ``np.allclose``: NumPy's defaults, rtol 1e-5, atol 1e-8;
* ``torch``: ``torch.testing.assert_close``'s default tolerances per dtype (float32 rtol
  1.3e-6 atol 1e-5, float16 1e-3 / 1e-5, bfloat16 1.6e-2 / 1e-5; from PyTorch's
  ``torch/testing/_comparison.py``), reimplemented here: PyTorch is not a dependency.

Both tolerance checks compare against the exact result rounded to the output dtype (the
reference output in that dtype), over every input the gate ran, with ``equal_nan=True``
and a non-finite value required where the reference has one, so the NaN and inf inputs
do not count against them. A kernel is rejected by a checker if any input fails it, or it
raised, or it returned the wrong shape or dtype.

Correct variants compute the op in float32 (the 16-bit types) or float32 itself, in many
orders and forms; each mutant is a correct variant with one plausible bug. A mutant counts
only if it changes the output, bit for bit, on some input the gate ran; the others are
equivalent. ``--seeds N`` then gates every correct variant on N gate seeds (the
false-alarm sweep). ``--timing`` times the gate on the bundled CPU kernels; with
``--before DIR`` (an older tree: ``git archive <rev> | tar -x -C DIR``) it times that
tree's gate beside this one, interleaved, through APIs every version of the gate has
(``--also DIR``, repeatable: another tree's first gate in the same rounds, say the tree
before a change beside the one a target names); then a user-op gate call at the sizes
of docs/accuracy.md's examples, with the derived trials and one re-gated pattern (issue
27, point 7), beside the older tree's without it.

The user-op study (issue 27) adds seven ops of a user's own, registered through the public
``pytest_arbiter.op`` (layer norm, row-wise logsumexp, cumsum, 1-D convolution, attention,
argmax, pairwise distances), each with correct kernels that round differently and mutants
a real bug would make, run on each op's test shapes in the three dtypes over 20 seeds
(``--user-seeds``; each seed a fresh dispatch input and gate seed). Each kernel is gated
through ``FunctionCandidate`` and ``f4_gate`` twice: on an op without ``gate_inputs`` (the
gate derives its trials) and on the same op with the ``gate_inputs`` its author would give
(large magnitudes, longer lengths, near points), which the gate runs before the derived
trials; the tolerance checks see the dispatch's inputs and the ``gate_inputs``'.
``torch``'s tolerance of an integer output (argmax) is its default for integer dtypes:
exact.

Run: ``python bench/gate_power.py`` (full, a few minutes), ``--quick`` (the CI form:
small shapes, 3 seeds), ``--user`` (the user-op study alone, about a minute), ``--timing``.
``tests/core/test_gate_power.py`` runs the quick form.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

Kernel = Callable[..., np.ndarray]
F32 = np.float32
LOG2E = float(np.log2(np.e))
TORCH_TOLERANCES = {"float32": (1.3e-6, 1e-5), "float16": (1e-3, 1e-5),
                    "bfloat16": (1.6e-2, 1e-5), "float64": (1e-7, 1e-7)}
DTYPES = ("float32", "float16", "bfloat16")
NARROW = ("float16", "bfloat16")
"""The output rounding mutants apply to these: a float32 kernel accumulates in float32 and
has no narrowing conversion to get wrong (rounding a float64 result toward zero would make
it more accurate than any correct float32 kernel, not less)."""
CHECKERS = ("F4", "np.allclose", "torch")
EPS = 1e-6  # rmsnorm's epsilon


# -- rounding helpers ---------------------------------------------------------------------

def _bits_type(dtype: np.dtype) -> type[np.unsignedinteger[Any]]:
    return np.uint16 if dtype.itemsize == 2 else np.uint32


def round_directed(values: np.ndarray, dtype: np.dtype, mode: str) -> np.ndarray:
    """``values`` rounded to ``dtype`` toward zero (``"trunc"``) or toward -inf
    (``"floor"``) instead of to nearest: the conversion bug of a hand-written cast."""
    exact = np.asarray(values, dtype=np.float64)
    out = exact.astype(dtype)
    back = out.astype(np.float64)
    bits = out.view(_bits_type(np.dtype(dtype))).copy()
    if mode == "trunc":
        fix = (np.abs(back) > np.abs(exact)) & (back != 0)
        bits[fix] -= 1
    else:
        down = (back > exact) & (back > 0)
        up = (back > exact) & (back < 0)
        bits[down] -= 1
        bits[up] += 1
        zero = (back > exact) & (back == 0)
        bits[zero] = np.array(1, bits.dtype) | (np.array(1, bits.dtype) << (8 * bits.itemsize - 1))
    return bits.view(dtype)


def round_tf32(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to nearest (ties to even) to TF32's 10 fraction bits."""
    bits = np.ascontiguousarray(values, dtype=F32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0xFFF + ((bits >> 13) & 1)) & ~np.uint64(0x1FFF)
    return bits.astype(np.uint32).view(F32)


def _f32(x: np.ndarray) -> np.ndarray:
    return x.astype(F32)


def _out(c: np.ndarray, like: np.ndarray) -> np.ndarray:
    return c.astype(like.dtype)


def _narrow(dtype: np.dtype) -> np.dtype:
    """The narrow type a buggy kernel keeps partials in: the 16-bit dtype itself, bfloat16
    for float32."""
    from pytest_arbiter.core.dtypes import numpy_dtype

    return dtype if dtype.itemsize == 2 else numpy_dtype("bfloat16")


# -- matmul: correct variants -------------------------------------------------------------

def mm_blas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _out(np.matmul(_f32(a), _f32(b)), a)


def mm_f64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _out(np.matmul(a.astype(np.float64), b.astype(np.float64)), a)


def _products_by_k(a: np.ndarray, b: np.ndarray, rows: slice) -> np.ndarray:
    """The rounded float32 products a_ik b_kj of ``rows``, K-major: (K, rows, N)."""
    return _f32(a[rows]).T[:, :, None] * _f32(b)[:, None, :]


def _row_chunks(a: np.ndarray, b: np.ndarray) -> list[slice]:
    step = max(1, (1 << 23) // max(1, a.shape[1] * b.shape[1]))
    return [slice(i, i + step) for i in range(0, a.shape[0], step)]


def _ordered(a: np.ndarray, b: np.ndarray, reverse: bool = False) -> np.ndarray:
    """Products added one by one in K order (NumPy reduces a non-contiguous axis in
    order, bit for bit the same as the loop ``acc += a[:, k] * b[k]``)."""
    out = np.empty((a.shape[0], b.shape[1]), F32)
    for rows in _row_chunks(a, b):
        products = _products_by_k(a, b, rows)
        out[rows] = np.add.reduce(products[::-1] if reverse else products, axis=0)
    return out


def mm_sequential(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """k = 0, 1, ...; every product rounded, then added: the most error-prone order."""
    return _out(_ordered(a, b), a)


def mm_reverse(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _out(_ordered(a, b, reverse=True), a)


def mm_fma(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sequential fused multiply-add: one rounding per step."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    for k in range(a.shape[1]):
        acc = (acc + a64[:, k, None] * b64[k]).astype(F32)
    return _out(acc, a)


def mm_pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The products summed by NumPy's pairwise float32 summation."""
    a32, bt = _f32(a), np.ascontiguousarray(_f32(b).T)
    out = np.empty((a.shape[0], b.shape[1]), F32)
    for rows in _row_chunks(a, b):
        out[rows] = np.sum(a32[rows][:, None, :] * bt[None, :, :], axis=-1)
    return _out(out, a)


def mm_blocked(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """K in blocks of 64, each a float32 BLAS product, added in order."""
    a32, b32 = _f32(a), _f32(b)
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    for start in range(0, a.shape[1], 64):
        acc += np.matmul(a32[:, start:start + 64], b32[start:start + 64])
    return _out(acc, a)


def mm_split_k(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Split-K: four partial products, added as a tree."""
    a32, b32 = _f32(a), _f32(b)
    cuts = np.linspace(0, a.shape[1], 5).astype(int)
    parts = [np.matmul(a32[:, i:j], b32[i:j]) for i, j in itertools.pairwise(cuts)]
    return _out((parts[0] + parts[1]) + (parts[2] + parts[3]), a)


def mm_kahan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a32, b32 = _f32(a), _f32(b)
    acc = np.zeros((a.shape[0], b.shape[1]), F32)
    comp = np.zeros_like(acc)
    for k in range(a.shape[1]):
        y = a32[:, k, None] * b32[k] - comp
        t = acc + y
        comp = (t - acc) - y
        acc = t
    return _out(acc, a)


def mm_lanes(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Eight SIMD-style lanes (k mod 8) accumulated in order, then added as a tree."""
    k = a.shape[1]
    pad = -k % 8
    a8 = np.pad(_f32(a), ((0, 0), (0, pad)))
    b8 = np.pad(_f32(b), ((0, pad), (0, 0)))
    out = np.empty((a.shape[0], b.shape[1]), F32)
    for rows in _row_chunks(a8, b8):
        products = _products_by_k(a8, b8, rows)
        lanes = np.add.reduce(products.reshape(-1, 8, *products.shape[1:]), axis=0)
        while lanes.shape[0] > 1:
            lanes = lanes[0::2] + lanes[1::2]
        out[rows] = lanes[0]
    return _out(out, a)


# -- matmul: mutants ----------------------------------------------------------------------

def mm_acc_narrow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Split-K partials (32 deep) kept in the narrow type between tiles."""
    narrow = _narrow(a.dtype)
    a32, b32 = _f32(a), _f32(b)
    acc = np.zeros((a.shape[0], b.shape[1]), narrow)
    for start in range(0, a.shape[1], 32):
        acc = (acc.astype(F32) + np.matmul(a32[:, start:start + 32],
                                           b32[start:start + 32])).astype(narrow)
    return _out(acc, a)


def mm_trunc(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return round_directed(np.matmul(a.astype(np.float64), b.astype(np.float64)), a.dtype,
                          "trunc")


def mm_floor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return round_directed(np.matmul(a.astype(np.float64), b.astype(np.float64)), a.dtype,
                          "floor")


def mm_scaled(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _out(np.matmul(_f32(a), _f32(b)) * F32(1.001), a)


def mm_k_tail(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The K loop stops at the last full tile of 32: the remainder is dropped."""
    k = a.shape[1] - a.shape[1] % 32
    return _out(np.matmul(_f32(a[:, :k]), _f32(b[:k])), a)


def mm_m_tail(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rows past the last full tile of 16 are never written (left zero)."""
    out = np.matmul(_f32(a), _f32(b))
    out[a.shape[0] - a.shape[0] % 16:] = 0.0
    return _out(out, a)


def mm_n_tail(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Columns past the last full tile of 8 get the tile's last column (a stale register)."""
    out = np.matmul(_f32(a), _f32(b))
    n8 = b.shape[1] - b.shape[1] % 8
    out[:, n8:] = out[:, n8 - 1:n8] if n8 else 0.0
    return _out(out, a)


def mm_corner(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One stray write: the last element off by 1e-4 of the output's largest value."""
    out = np.matmul(_f32(a), _f32(b))
    if out.size:
        finite = np.isfinite(out)
        scale = float(np.max(np.abs(out[finite]))) if finite.any() else 0.0
        out[-1, -1] += F32(1e-4 * scale)
    return _out(out, a)


def mm_tf32(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 inputs rounded to TF32 (a GPU default): wrong unless TF32 is allowed."""
    return _out(np.matmul(round_tf32(a), round_tf32(b)), a)


def mm_bf16_inputs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    narrow = _narrow(np.dtype(np.float32))
    return _out(np.matmul(_f32(a.astype(narrow)), _f32(b.astype(narrow))), a)


def mm_zero_skip(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Skips the products with a zero factor (a sparsity shortcut): 0 * inf and 0 * NaN
    give 0 instead of NaN."""
    a32, b32 = _f32(a), _f32(b)
    out = np.matmul(np.where(np.isfinite(a32), a32, 0), np.where(np.isfinite(b32), b32, 0))
    for i, k in zip(*np.nonzero(~np.isfinite(a32)), strict=True):
        nz = b32[k] != 0
        out[i, nz] += a32[i, k] * b32[k, nz]
    for k, j in zip(*np.nonzero(~np.isfinite(b32)), strict=True):
        nz = a32[:, k] != 0
        out[nz, j] += a32[nz, k] * b32[k, j]
    return _out(out, a)


def mm_off_by_one(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The last K step reads B's row K-2 instead of K-1."""
    a32, b32 = _f32(a), _f32(b)
    k = a.shape[1]
    if k < 2:
        return _out(np.matmul(a32, b32), a)
    return _out(np.matmul(a32[:, :-1], b32[:-1]) + a32[:, -1:] * b32[-2], a)


def mm_ftz16(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float16 subnormal results flushed to zero (float16 hardware keeps them)."""
    out = np.matmul(_f32(a), _f32(b))
    out[np.abs(out) < 2.0 ** -14] = 0.0
    return _out(out, a)


# -- softmax: correct variants ------------------------------------------------------------

def _rows_max(w: np.ndarray) -> np.ndarray:
    out: np.ndarray = w.max(axis=-1, keepdims=True)
    return out


def sm_two_pass(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    e = np.exp(w - _rows_max(w))
    return _out(e / e.sum(axis=-1, keepdims=True), x)


def sm_log_sum_exp(x: np.ndarray) -> np.ndarray:
    """exp((x - max) - log sum): the form that failed the old budget."""
    w = _f32(x)
    t = w - _rows_max(w)
    return _out(np.exp(t - np.log(np.exp(t).sum(axis=-1, keepdims=True))), x)


def sm_reciprocal(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    e = np.exp(w - _rows_max(w))
    return _out(e * (F32(1) / e.sum(axis=-1, keepdims=True)), x)


def sm_f64(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float64)
    e = np.exp(w - _rows_max(w))
    return _out(e / e.sum(axis=-1, keepdims=True), x)


def sm_exp2(x: np.ndarray) -> np.ndarray:
    """exp as exp2(t log2 e), as GPU fast paths do."""
    w = _f32(x)
    e = np.exp2((w - _rows_max(w)) * F32(LOG2E))
    return _out(e / e.sum(axis=-1, keepdims=True), x)


def sm_sequential(x: np.ndarray) -> np.ndarray:
    """The sum added left to right (NumPy's reduction over a non-contiguous axis)."""
    w = _f32(x)
    e = np.exp(w - _rows_max(w))
    total = np.add.reduce(np.moveaxis(e, -1, 0), axis=0)[..., None]
    return _out(e / total, x)


def _online(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Running max and rescaled running sum over blocks of ``block`` columns."""
    m = np.full((*w.shape[:-1], 1), -np.inf, F32)
    s = np.zeros_like(m)
    for start in range(0, w.shape[-1], block):
        chunk = w[..., start:start + block]
        new = np.maximum(m, chunk.max(axis=-1, keepdims=True))
        scale = np.where(m == new, F32(1), np.exp(m - new))
        terms = np.where(chunk == -np.inf, F32(0), np.exp(chunk - new))
        s = s * scale + terms.sum(axis=-1, keepdims=True)
        m = new
    return m, s


def sm_online(x: np.ndarray) -> np.ndarray:
    """One pass: a running max, the sum rescaled at each new max (element by element)."""
    w = _f32(x)
    m, s = _online(w, 1)
    return _out(np.exp(w - m) / s, x)


def sm_online_blocked(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    m, s = _online(w, 32)
    return _out(np.exp(w - m) / s, x)


# -- softmax: mutants ---------------------------------------------------------------------

def sm_no_max(x: np.ndarray) -> np.ndarray:
    e = np.exp(_f32(x))
    return _out(e / e.sum(axis=-1, keepdims=True), x)


def sm_global_max(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    e = np.exp(w - w.max())
    return _out(e / e.sum(axis=-1, keepdims=True), x)


def sm_eps(x: np.ndarray) -> np.ndarray:
    """A "safe" denominator: sum + 1e-3."""
    w = _f32(x)
    e = np.exp(w - _rows_max(w))
    return _out(e / (e.sum(axis=-1, keepdims=True) + F32(1e-3)), x)


def sm_drop_tail(x: np.ndarray) -> np.ndarray:
    """The sum stops at the last full tile of 32 columns."""
    w = _f32(x)
    e = np.exp(w - _rows_max(w))
    n = w.shape[-1] - w.shape[-1] % 32
    return _out(e / e[..., :n].sum(axis=-1, keepdims=True), x)


def sm_sum_narrow(x: np.ndarray) -> np.ndarray:
    """The sum accumulated, in order, in the narrow type."""
    narrow = _narrow(x.dtype)
    w = _f32(x)
    e = np.exp(w - _rows_max(w))
    total = np.zeros((*w.shape[:-1], 1), narrow)
    for start in range(w.shape[-1]):
        total = (total.astype(F32) + e[..., start:start + 1]).astype(narrow)
    return _out(e / total.astype(F32), x)


def sm_exp_narrow(x: np.ndarray) -> np.ndarray:
    """exp rounded to the narrow type before the sum and the division (a rounding too
    many)."""
    narrow = _narrow(x.dtype)
    w = _f32(x)
    e = np.exp(w - _rows_max(w)).astype(narrow).astype(F32)
    return _out(e / e.sum(axis=-1, keepdims=True), x)


def sm_trunc(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float64)
    e = np.exp(w - _rows_max(w))
    return round_directed(e / e.sum(axis=-1, keepdims=True), x.dtype, "trunc")


def sm_scaled(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    e = np.exp(w - _rows_max(w))
    return _out(e / e.sum(axis=-1, keepdims=True) * F32(1.001), x)


def sm_masked_zero(x: np.ndarray) -> np.ndarray:
    """A fully masked row returns zeros (the reference: NaN)."""
    w = _f32(x)
    top = _rows_max(w)
    e = np.exp(w - np.where(top == -np.inf, F32(0), top))
    total = e.sum(axis=-1, keepdims=True)
    return _out(np.where(total > 0, e / np.where(total > 0, total, 1), 0), x)


def sm_nan_as_masked(x: np.ndarray) -> np.ndarray:
    """NaN inputs treated as masked (-inf): a NaN row comes back finite."""
    return sm_two_pass(np.where(np.isnan(x), -np.inf, x).astype(x.dtype))


# -- the user op: rmsnorm -----------------------------------------------------------------

def rms_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    out: np.ndarray = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + EPS) * w64
    return out


def _rms(x: np.ndarray, w: np.ndarray, ms: np.ndarray, *, eps: float = EPS,
         weight: bool = True) -> np.ndarray:
    y = _f32(x) / np.sqrt(ms + F32(eps))
    return _out(y * _f32(w) if weight else y, x)


def rms_f32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x32 = _f32(x)
    return _rms(x, w, np.mean(x32 * x32, axis=-1, keepdims=True))


def rms_f64(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _out(rms_reference(x, w), x)


def rms_rsqrt(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x32 = _f32(x)
    r = F32(1) / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + F32(EPS))
    return _out(x32 * r * _f32(w), x)


def rms_sequential(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x32 = _f32(x)
    total = np.zeros((*x.shape[:-1], 1), F32)
    for j in range(x.shape[-1]):
        total += x32[..., j:j + 1] * x32[..., j:j + 1]
    return _rms(x, w, total / F32(x.shape[-1]))


def rms_n_minus_1(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x32 = _f32(x)
    return _rms(x, w, (x32 * x32).sum(axis=-1, keepdims=True) / F32(x.shape[-1] - 1))


def rms_drop_tail(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x32 = _f32(x)
    n = x.shape[-1] - x.shape[-1] % 32
    return _rms(x, w, (x32[..., :n] ** 2).sum(axis=-1, keepdims=True) / F32(x.shape[-1]))


def rms_ms_narrow(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    narrow = _narrow(x.dtype)
    x32 = _f32(x)
    total = np.zeros((*x.shape[:-1], 1), narrow)
    for j in range(x.shape[-1]):
        total = (total.astype(F32) + x32[..., j:j + 1] ** 2).astype(narrow)
    return _rms(x, w, total.astype(F32) / F32(x.shape[-1]))


def rms_trunc(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return round_directed(rms_reference(x, w), x.dtype, "trunc")


def rms_eps_big(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x32 = _f32(x)
    return _rms(x, w, np.mean(x32 * x32, axis=-1, keepdims=True), eps=1e-2)


def rms_no_weight(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x32 = _f32(x)
    return _rms(x, w, np.mean(x32 * x32, axis=-1, keepdims=True), weight=False)


# -- user ops of one's own (issue 27): kernels --------------------------------------------
#
# Seven ops a user adds with ``pytest_arbiter.op(...)``, each with a float64 NumPy
# reference, correct kernels that round differently (float32 or float64, other summation
# orders, Welford, online and blocked forms) and mutants a real bug would make. Every
# kernel computes in float32 (float64 where named) and rounds once to the input dtype.

LN_EPS = 1e-5  # layer norm's epsilon, passed as a plain Python float


def _rows_sum_seq(t: np.ndarray) -> np.ndarray:
    """Row sums of the last axis added left to right (a non-contiguous reduction)."""
    out: np.ndarray = np.add.reduce(np.moveaxis(t, -1, 0), axis=0)[..., None]
    return out


def _seq_narrow_sum(t: np.ndarray, narrow: np.dtype) -> np.ndarray:
    """Row sums of float32 ``t`` accumulated left to right in ``narrow``, as float32."""
    total = np.zeros((*t.shape[:-1], 1), narrow)
    for j in range(t.shape[-1]):
        total = (total.astype(F32) + t[..., j:j + 1]).astype(narrow)
    return total.astype(F32)


# layer norm over the last axis: (x - mean) / sqrt(var + eps) * w + b

def ln_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(np.float64)
    d = x64 - x64.mean(axis=-1, keepdims=True)
    var = (d * d).mean(axis=-1, keepdims=True)
    out: np.ndarray = d / np.sqrt(var + eps) * w.astype(np.float64) + b.astype(np.float64)
    return out


def _ln_finish(x: np.ndarray, w: np.ndarray, b: np.ndarray, d: np.ndarray,
               var: np.ndarray, eps: float) -> np.ndarray:
    return _out(d / np.sqrt(var + F32(eps)) * _f32(w) + _f32(b), x)


def ln_two_pass(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x32 = _f32(x)
    d = x32 - x32.mean(axis=-1, keepdims=True)
    return _ln_finish(x, w, b, d, (d * d).mean(axis=-1, keepdims=True), eps)


def ln_f64(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    return _out(ln_reference(x, w, b, eps), x)


def ln_welford(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """Welford's running mean and M2, one element at a time, in float32."""
    x32 = _f32(x)
    mean = np.zeros((*x.shape[:-1], 1), F32)
    m2 = np.zeros_like(mean)
    for j in range(x.shape[-1]):
        v = x32[..., j:j + 1]
        delta = v - mean
        mean = mean + delta / F32(j + 1)
        m2 = m2 + delta * (v - mean)
    return _ln_finish(x, w, b, x32 - mean, m2 / F32(x.shape[-1]), eps)


def ln_welford_blocks(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """Blocks of 32 reduced two-pass, merged by Chan's parallel update (a GPU kernel's
    warp-level Welford)."""
    x32 = _f32(x)
    count = F32(0)
    mean = np.zeros((*x.shape[:-1], 1), F32)
    m2 = np.zeros_like(mean)
    for start in range(0, x.shape[-1], 32):
        chunk = x32[..., start:start + 32]
        nb = F32(chunk.shape[-1])
        mb = chunk.mean(axis=-1, keepdims=True)
        m2b = ((chunk - mb) ** 2).sum(axis=-1, keepdims=True)
        total = count + nb
        delta = mb - mean
        mean = mean + delta * (nb / total)
        m2 = m2 + m2b + delta * delta * (count * nb / total)
        count = total
    return _ln_finish(x, w, b, x32 - mean, m2 / count, eps)


def ln_rsqrt(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """The reciprocal square root folded into the weight, as fused kernels do."""
    x32 = _f32(x)
    d = x32 - _rows_sum_seq(x32) / F32(x.shape[-1])
    r = F32(1) / np.sqrt(_rows_sum_seq(d * d) / F32(x.shape[-1]) + F32(eps))
    return _out(d * (r * _f32(w)) + _f32(b), x)


def ln_one_pass(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """var = E[x^2] - E[x]^2 in float32 (clamped at 0): cancels on a large mean."""
    x32 = _f32(x)
    mean = x32.mean(axis=-1, keepdims=True)
    var = np.maximum((x32 * x32).mean(axis=-1, keepdims=True) - mean * mean, F32(0))
    return _ln_finish(x, w, b, x32 - mean, var, eps)


def ln_unbiased(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x32 = _f32(x)
    d = x32 - x32.mean(axis=-1, keepdims=True)
    return _ln_finish(x, w, b, d, (d * d).sum(axis=-1, keepdims=True)
                      / F32(x.shape[-1] - 1), eps)


def ln_eps_outside(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    x32 = _f32(x)
    d = x32 - x32.mean(axis=-1, keepdims=True)
    std = np.sqrt((d * d).mean(axis=-1, keepdims=True))
    return _out(d / (std + F32(eps)) * _f32(w) + _f32(b), x)


def ln_no_eps(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    return ln_two_pass(x, w, b, 0.0)


def ln_var_narrow(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """The squares summed in order in the narrow type (the input's, bfloat16 for
    float32): the upcast forgotten."""
    x32 = _f32(x)
    d = x32 - x32.mean(axis=-1, keepdims=True)
    var = _seq_narrow_sum(d * d, _narrow(x.dtype)) / F32(x.shape[-1])
    return _ln_finish(x, w, b, d, var, eps)


def ln_affine_order(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """(x_hat + b) * w: the bias added before the weight."""
    x32 = _f32(x)
    d = x32 - x32.mean(axis=-1, keepdims=True)
    xh = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + F32(eps))
    return _out((xh + _f32(b)) * _f32(w), x)


def ln_trunc(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    return round_directed(ln_reference(x, w, b, eps), x.dtype, "trunc")


# row-wise logsumexp over the last axis

def lse_reference(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float64)
    top = w.max(axis=-1, keepdims=True)
    out: np.ndarray = (top + np.log(np.exp(w - top).sum(axis=-1, keepdims=True)))[..., 0]
    return out


def lse_two_pass(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    top = _rows_max(w)
    return _out((top + np.log(np.exp(w - top).sum(axis=-1, keepdims=True)))[..., 0], x)


def lse_f64(x: np.ndarray) -> np.ndarray:
    return _out(lse_reference(x), x)


def lse_sequential(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    top = _rows_max(w)
    return _out((top + np.log(_rows_sum_seq(np.exp(w - top))))[..., 0], x)


def lse_online(x: np.ndarray) -> np.ndarray:
    """One pass by blocks of 32: a running max, the sum rescaled at each new max."""
    m, s = _online(_f32(x), 32)
    return _out((m + np.log(s))[..., 0], x)


def lse_exp2(x: np.ndarray) -> np.ndarray:
    """exp2 and log2 with the log2(e) factor folded in, as GPU fast paths do."""
    w = _f32(x)
    top = _rows_max(w)
    s = np.exp2((w - top) * F32(LOG2E)).sum(axis=-1, keepdims=True)
    return _out((top + np.log2(s) * F32(1 / LOG2E))[..., 0], x)


def lse_no_max(x: np.ndarray) -> np.ndarray:
    return _out(np.log(np.exp(_f32(x)).sum(axis=-1)), x)


def lse_global_max(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    top = w.max()
    return _out(top + np.log(np.exp(w - top).sum(axis=-1)), x)


def lse_sum_narrow(x: np.ndarray) -> np.ndarray:
    w = _f32(x)
    top = _rows_max(w)
    return _out((top + np.log(_seq_narrow_sum(np.exp(w - top), _narrow(x.dtype))))[..., 0], x)


def lse_drop_tail(x: np.ndarray) -> np.ndarray:
    """The sum stops at the last full tile of 32 columns."""
    w = _f32(x)
    top = _rows_max(w)
    n = w.shape[-1] - w.shape[-1] % 32 or w.shape[-1]
    return _out((top + np.log(np.exp(w[..., :n] - top).sum(axis=-1, keepdims=True)))[..., 0],
                x)


def lse_trunc(x: np.ndarray) -> np.ndarray:
    return round_directed(lse_reference(x), x.dtype, "trunc")


# cumsum over the last axis

def cs_reference(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.cumsum(x.astype(np.float64), axis=-1)
    return out


def cs_sequential(x: np.ndarray) -> np.ndarray:
    return _out(np.cumsum(_f32(x), axis=-1), x)


def cs_f64(x: np.ndarray) -> np.ndarray:
    return _out(cs_reference(x), x)


def _blocked_scan(x32: np.ndarray, block: int, *, carry_bug: int = 0) -> np.ndarray:
    """Scan each block of ``block`` columns, then add the running total of the blocks
    before it (a GPU's two-level scan). ``carry_bug``: from block ``carry_bug`` on, the
    carry is the previous block's total alone, not the running one."""
    out = np.empty_like(x32)
    carry = np.zeros((*x32.shape[:-1], 1), F32)
    for i, start in enumerate(range(0, x32.shape[-1], block)):
        local = np.cumsum(x32[..., start:start + block], axis=-1)
        out[..., start:start + block] = local + carry
        total = local[..., -1:]
        carry = total if carry_bug and i + 1 >= carry_bug else carry + total
    return out


def cs_blocked(x: np.ndarray) -> np.ndarray:
    return _out(_blocked_scan(_f32(x), 64), x)


def cs_hillis_steele(x: np.ndarray) -> np.ndarray:
    """Hillis-Steele scan: log2(n) steps of y[i] += y[i - 2^k], a different tree."""
    y = _f32(x).copy()
    step = 1
    while step < y.shape[-1]:
        shifted = np.zeros_like(y)
        shifted[..., step:] = y[..., :-step]
        y = y + shifted
        step *= 2
    return _out(y, x)


def cs_exclusive(x: np.ndarray) -> np.ndarray:
    """An exclusive scan where the inclusive one is meant (y[i] = x[0] + ... + x[i-1])."""
    y = np.cumsum(_f32(x), axis=-1)
    out = np.zeros_like(y)
    out[..., 1:] = y[..., :-1]
    return _out(out, x)


def cs_narrow(x: np.ndarray) -> np.ndarray:
    """Accumulated in the input's own 16-bit type (bfloat16 for float32): the
    ``dtype=float32`` of the accumulator forgotten."""
    narrow = _narrow(x.dtype)
    return _out(np.cumsum(x.astype(narrow), axis=-1, dtype=narrow).astype(F32), x)


def cs_carry(x: np.ndarray) -> np.ndarray:
    """A two-level scan by blocks of 1024 whose carry, from the third block on, is the
    previous block's total alone: right up to 2048 elements."""
    return _out(_blocked_scan(_f32(x), 1024, carry_bug=2), x)


def cs_trunc(x: np.ndarray) -> np.ndarray:
    return round_directed(cs_reference(x), x.dtype, "trunc")


# 1-D convolution (valid cross-correlation, as deep-learning frameworks define it)

def _windows(x: np.ndarray, k: int) -> np.ndarray:
    out: np.ndarray = np.lib.stride_tricks.sliding_window_view(x, k, axis=-1)
    return out


def conv_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    out: np.ndarray = _windows(x.astype(np.float64), w.shape[0]) @ w.astype(np.float64)
    return out


def conv_gemm(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """im2col then a float32 matrix-vector product."""
    return _out(_windows(_f32(x), w.shape[0]) @ _f32(w), x)


def conv_f64(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _out(conv_reference(x, w), x)


def _taps(x32: np.ndarray, w32: np.ndarray, order: Sequence[int]) -> np.ndarray:
    k = w32.shape[0]
    n = x32.shape[-1] - k + 1
    acc = np.zeros((*x32.shape[:-1], n), F32)
    for j in order:
        acc += x32[..., j:j + n] * w32[j]
    return acc


def conv_taps(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Tap by tap, in order: acc += x[i + j] w[j]."""
    return _out(_taps(_f32(x), _f32(w), range(w.shape[0])), x)


def conv_taps_reversed(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _out(_taps(_f32(x), _f32(w), range(w.shape[0] - 1, -1, -1)), x)


def conv_fft(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """By the FFT in float32 (complex64), as FFT convolution algorithms do."""
    x32, w32 = _f32(x), _f32(w)
    k, n = w32.shape[0], x32.shape[-1]
    size = 1 << (n + k - 1).bit_length()
    spec = np.fft.rfft(x32, size, axis=-1) * np.conj(np.fft.rfft(w32, size))
    full = np.fft.irfft(spec, size, axis=-1).astype(F32)
    return _out(full[..., :n - k + 1], x)


def conv_flipped(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A true convolution (the kernel flipped) where a cross-correlation is meant."""
    return conv_gemm(x, np.ascontiguousarray(w[::-1]))


def conv_halo(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Outputs in tiles of 512 whose input tile has no halo: the last k - 1 outputs of
    each full tile miss the taps past it (right while the output fits one tile)."""
    x32, w32 = _f32(x), _f32(w)
    k = w32.shape[0]
    n_out = x32.shape[-1] - k + 1
    out = np.empty((*x32.shape[:-1], n_out), F32)
    for start in range(0, n_out, 512):
        stop = min(start + 512, n_out)
        tile = x32[..., start:stop + k - 1] if stop == n_out else x32[..., start:stop]
        padded = np.concatenate([tile, np.zeros((*tile.shape[:-1], stop + k - 1 - start
                                                 - tile.shape[-1]), F32)], axis=-1)
        out[..., start:stop] = _windows(padded, k) @ w32
    return _out(out, x)


def conv_tail(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Outputs past the last full tile of 32 never written (left zero)."""
    out = _windows(_f32(x), w.shape[0]) @ _f32(w)
    out[..., out.shape[-1] - out.shape[-1] % 32:] = 0.0
    return _out(out, x)


def conv_narrow(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Tap by tap with the accumulator in the narrow type."""
    narrow = _narrow(x.dtype)
    x32, w32 = _f32(x), _f32(w)
    k = w32.shape[0]
    n = x32.shape[-1] - k + 1
    acc = np.zeros((*x32.shape[:-1], n), narrow)
    for j in range(k):
        acc = (acc.astype(F32) + x32[..., j:j + n] * w32[j]).astype(narrow)
    return _out(acc.astype(F32), x)


def conv_trunc(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return round_directed(conv_reference(x, w), x.dtype, "trunc")


# attention: softmax(Q K^T / sqrt(d)) V, one head

def attn_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q.astype(np.float64) @ k.astype(np.float64).T / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    out: np.ndarray = p / p.sum(axis=-1, keepdims=True) @ v.astype(np.float64)
    return out


def _scores(q: np.ndarray, k: np.ndarray, scale: float | None = None) -> np.ndarray:
    s: np.ndarray = _f32(q) @ _f32(k).T
    return s * F32(1 / np.sqrt(q.shape[-1]) if scale is None else scale)


def attn_standard(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = _scores(q, k)
    p = np.exp(s - _rows_max(s))
    return _out(p / p.sum(axis=-1, keepdims=True) @ _f32(v), q)


def attn_f64(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return _out(attn_reference(q, k, v), q)


def attn_late_divide(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(P V) / sum after the second product, not P / sum before it."""
    s = _scores(q, k)
    p = np.exp(s - _rows_max(s))
    return _out((p @ _f32(v)) / p.sum(axis=-1, keepdims=True), q)


def _flash(q: np.ndarray, k: np.ndarray, v: np.ndarray, block: int, *,
           rescale: bool = True, exp2: bool = False) -> np.ndarray:
    """FlashAttention's loop over key blocks: running max, running sum and output
    accumulator, rescaled at each new max, divided at the end."""
    q32, k32, v32 = _f32(q), _f32(k), _f32(v)
    scale = F32(1 / np.sqrt(q.shape[-1]) * (LOG2E if exp2 else 1.0))
    power = np.exp2 if exp2 else np.exp
    m = np.full((q.shape[0], 1), -np.inf, F32)
    s_sum = np.zeros((q.shape[0], 1), F32)
    acc = np.zeros((q.shape[0], v.shape[-1]), F32)
    for start in range(0, k.shape[0], block):
        s = (q32 @ k32[start:start + block].T) * scale
        new = np.maximum(m, _rows_max(s))
        p = power(s - new)
        factor = np.where(m == new, F32(1), power(m - new))
        s_sum = s_sum * factor + p.sum(axis=-1, keepdims=True)
        acc = (acc * factor if rescale else acc) + p @ v32[start:start + block]
        m = new
    return acc / s_sum


def attn_flash(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return _out(_flash(q, k, v, 64), q)


def attn_flash_exp2(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """FlashAttention-2's form: exp2, with log2(e) folded into the score scale."""
    return _out(_flash(q, k, v, 32, exp2=True), q)


def attn_no_scale(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = _scores(q, k, 1.0)
    p = np.exp(s - _rows_max(s))
    return _out(p / p.sum(axis=-1, keepdims=True) @ _f32(v), q)


def attn_scale_d(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = _scores(q, k, 1.0 / q.shape[-1])
    p = np.exp(s - _rows_max(s))
    return _out(p / p.sum(axis=-1, keepdims=True) @ _f32(v), q)


def attn_no_max(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    p = np.exp(_scores(q, k))
    return _out(p / p.sum(axis=-1, keepdims=True) @ _f32(v), q)


def attn_no_rescale(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """FlashAttention whose output accumulator is not rescaled at a new max (the sum is):
    right while the keys fit one block of 64."""
    return _out(_flash(q, k, v, 64, rescale=False), q)


def attn_p_narrow(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """The probabilities rounded to the input's 16-bit type before P V (what a
    tensor-core FlashAttention does): a rounding more than one."""
    s = _scores(q, k)
    p = np.exp(s - _rows_max(s))
    total = p.sum(axis=-1, keepdims=True)
    return _out((p.astype(q.dtype).astype(F32) @ _f32(v)) / total, q)


def attn_trunc(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return round_directed(attn_reference(q, k, v), q.dtype, "trunc")


# argmax over the last axis (int64; the first index on ties, the first NaN if any)

def am_reference(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.argmax(x.astype(np.float64), axis=-1)
    return out


def am_native(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.argmax(x, axis=-1).astype(np.int64)
    return out


def am_two_pass(x: np.ndarray) -> np.ndarray:
    """The max, then the first index that equals it (the first NaN in a row with one)."""
    w = _f32(x)
    top = w.max(axis=-1, keepdims=True)
    hit = np.where(np.isnan(top), np.isnan(w), w == top)
    return np.argmax(hit, axis=-1).astype(np.int64)


def am_blocked(x: np.ndarray) -> np.ndarray:
    """Per block of 64: its max and first index, then the blocks combined in order,
    a later block winning only when strictly larger (or the first NaN)."""
    w = _f32(x)
    best = np.full(w.shape[:-1], -np.inf, F32)
    where = np.zeros(w.shape[:-1], np.int64)
    for start in range(0, w.shape[-1], 64):
        chunk = w[..., start:start + 64]
        i = np.argmax(chunk, axis=-1)
        v = np.take_along_axis(chunk, i[..., None], axis=-1)[..., 0]
        take = ((v > best) | (np.isnan(v) & ~np.isnan(best))) | (
            (start == 0) & np.ones_like(best, dtype=bool))
        best = np.where(take, v, best)
        where = np.where(take, i + start, where)
    return where


def am_plus_one(x: np.ndarray) -> np.ndarray:
    return am_native(x) + 1


def am_last_tie(x: np.ndarray) -> np.ndarray:
    """The last maximal index (a scan with >=, not >)."""
    n = x.shape[-1]
    return (n - 1 - np.argmax(x[..., ::-1], axis=-1)).astype(np.int64)


def am_nan_ignored(x: np.ndarray) -> np.ndarray:
    """NaN never compares greater, so a scan with > skips it."""
    w = _f32(x)
    return np.argmax(np.where(np.isnan(w), -np.inf, w), axis=-1).astype(np.int64)


def am_narrow(x: np.ndarray) -> np.ndarray:
    """float32 values compared after rounding to bfloat16: near-ties become ties."""
    return am_native(x.astype(_narrow(x.dtype)))


def am_abs(x: np.ndarray) -> np.ndarray:
    """The argmax of |x| (an amax kernel reused)."""
    return np.argmax(np.abs(_f32(x)), axis=-1).astype(np.int64)


# pairwise Euclidean distances between the rows of x (n, d) and y (m, d)

def pd_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    diff = x.astype(np.float64)[:, None, :] - y.astype(np.float64)[None, :, :]
    out: np.ndarray = np.sqrt((diff * diff).sum(axis=-1))
    return out


def pd_direct(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    diff = _f32(x)[:, None, :] - _f32(y)[None, :, :]
    return _out(np.sqrt((diff * diff).sum(axis=-1)), x)


def pd_f64(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return _out(pd_reference(x, y), x)


def pd_sequential(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The squared differences added feature by feature, in order."""
    x32, y32 = _f32(x), _f32(y)
    acc = np.zeros((x.shape[0], y.shape[0]), F32)
    for j in range(x.shape[1]):
        diff = x32[:, j, None] - y32[None, :, j]
        acc += diff * diff
    return _out(np.sqrt(acc), x)


def pd_gemm(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """|x|^2 + |y|^2 - 2 x.y by a float32 GEMM, clamped at 0: fast, and it cancels on
    near points."""
    x32, y32 = _f32(x), _f32(y)
    sq = ((x32 * x32).sum(axis=1)[:, None] + (y32 * y32).sum(axis=1)[None, :]
          - F32(2) * (x32 @ y32.T))
    return _out(np.sqrt(np.maximum(sq, F32(0))), x)


def pd_no_sqrt(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    diff = _f32(x)[:, None, :] - _f32(y)[None, :, :]
    return _out((diff * diff).sum(axis=-1), x)


def pd_d_tail(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The features past the last full tile of 16 dropped."""
    d = x.shape[1] - x.shape[1] % 16 or x.shape[1]
    return pd_direct(x[:, :d], y[:, :d])


def pd_narrow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The squared differences accumulated in the narrow type."""
    narrow = _narrow(x.dtype)
    x32, y32 = _f32(x), _f32(y)
    acc = np.zeros((x.shape[0], y.shape[0]), narrow)
    for j in range(x.shape[1]):
        diff = x32[:, j, None] - y32[None, :, j]
        acc = (acc.astype(F32) + diff * diff).astype(narrow)
    return _out(np.sqrt(acc.astype(F32)), x)


def pd_trunc(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return round_directed(pd_reference(x, y), x.dtype, "trunc")


# -- the catalogue ------------------------------------------------------------------------

@dataclass(frozen=True)
class Variant:
    """A kernel under test: a correct variant (``base`` empty) or a mutant of ``base``."""

    name: str
    op: str
    fn: Kernel
    base: str = ""
    dtypes: tuple[str, ...] = DTYPES
    note: str = ""
    max_work: int = 0
    """A Python loop over K: not run on a case with more than this many M N K products
    (0: no limit)."""

    def runs_on(self, case: Case) -> bool:
        work = int(np.prod(case.shape)) if case.op == "matmul" else 0
        return case.dtype in self.dtypes and (not self.max_work or work <= self.max_work)

    @property
    def correct(self) -> bool:
        return not self.base


USER_OP = "bench_rmsnorm"
LOOP_WORK = 1 << 23
"""The loop variants (fma, kahan) run on cases up to this many products (40x24x4096)."""
ORDERED_WORK = 1 << 26
"""The one-product-at-a-time variants run up to this many (not 256x256x4096: minutes)."""

VARIANTS: tuple[Variant, ...] = (
    Variant("blas", "matmul", mm_blas),
    Variant("float64", "matmul", mm_f64),
    Variant("sequential", "matmul", mm_sequential, max_work=ORDERED_WORK),
    Variant("reverse", "matmul", mm_reverse, max_work=ORDERED_WORK),
    Variant("fma", "matmul", mm_fma, max_work=LOOP_WORK),
    Variant("pairwise", "matmul", mm_pairwise, max_work=ORDERED_WORK),
    Variant("blocked-64", "matmul", mm_blocked),
    Variant("split-K-4", "matmul", mm_split_k),
    Variant("kahan", "matmul", mm_kahan, max_work=LOOP_WORK),
    Variant("lanes-8", "matmul", mm_lanes, max_work=ORDERED_WORK),
    Variant("acc-narrow", "matmul", mm_acc_narrow, "blas",
            note="split-K partials kept in the narrow type"),
    Variant("trunc-out", "matmul", mm_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("floor-out", "matmul", mm_floor, "float64", dtypes=NARROW,
            note="output rounded toward -inf"),
    Variant("scale-1e-3", "matmul", mm_scaled, "blas", note="result times 1.001"),
    Variant("k-tail", "matmul", mm_k_tail, "blas", note="K remainder past 32 dropped"),
    Variant("m-tail", "matmul", mm_m_tail, "blas", note="rows past 16-tiles unwritten"),
    Variant("n-tail", "matmul", mm_n_tail, "blas", note="columns past 8-tiles stale"),
    Variant("corner-1e-4", "matmul", mm_corner, "blas",
            note="one element off by 1e-4 max|C|"),
    Variant("tf32", "matmul", mm_tf32, "blas", dtypes=("float32",),
            note="inputs rounded to TF32"),
    Variant("bf16-inputs", "matmul", mm_bf16_inputs, "blas", dtypes=("float32", "float16"),
            note="inputs cast through bfloat16"),
    Variant("zero-skip", "matmul", mm_zero_skip, "blas", note="0*inf, 0*NaN skipped"),
    Variant("off-by-one-k", "matmul", mm_off_by_one, "blas", note="last K step reads row K-2"),
    Variant("ftz-fp16", "matmul", mm_ftz16, "blas", dtypes=("float16",),
            note="float16 subnormal results flushed"),
    Variant("two-pass", "softmax", sm_two_pass),
    Variant("log-sum-exp", "softmax", sm_log_sum_exp),
    Variant("reciprocal", "softmax", sm_reciprocal),
    Variant("float64", "softmax", sm_f64),
    Variant("exp2", "softmax", sm_exp2),
    Variant("sequential-sum", "softmax", sm_sequential),
    Variant("online", "softmax", sm_online),
    Variant("online-32", "softmax", sm_online_blocked),
    Variant("no-max", "softmax", sm_no_max, "two-pass", note="no max subtraction"),
    Variant("global-max", "softmax", sm_global_max, "two-pass", note="max over all rows"),
    Variant("eps-1e-3", "softmax", sm_eps, "two-pass", note="sum + 1e-3 in the denominator"),
    Variant("drop-tail", "softmax", sm_drop_tail, "two-pass",
            note="sum stops at the last 32-tile"),
    Variant("sum-narrow", "softmax", sm_sum_narrow, "two-pass", note="sum in the narrow type"),
    Variant("exp-narrow", "softmax", sm_exp_narrow, "two-pass",
            note="exp rounded to the narrow type"),
    Variant("trunc-out", "softmax", sm_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("scale-1e-3", "softmax", sm_scaled, "two-pass", note="result times 1.001"),
    Variant("masked-zero", "softmax", sm_masked_zero, "two-pass",
            note="fully masked row gives 0, not NaN"),
    Variant("nan-as-masked", "softmax", sm_nan_as_masked, "two-pass",
            note="NaN treated as -inf"),
    Variant("float32", USER_OP, rms_f32),
    Variant("float64", USER_OP, rms_f64),
    Variant("rsqrt", USER_OP, rms_rsqrt),
    Variant("sequential", USER_OP, rms_sequential),
    Variant("n-minus-1", USER_OP, rms_n_minus_1, "float32", note="mean over n - 1"),
    Variant("drop-tail", USER_OP, rms_drop_tail, "float32", note="sum stops at a 32-tile"),
    Variant("ms-narrow", USER_OP, rms_ms_narrow, "float32",
            note="sum of squares in the narrow type"),
    Variant("trunc-out", USER_OP, rms_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("eps-1e-2", USER_OP, rms_eps_big, "float32", note="epsilon 1e-2, not 1e-6"),
    Variant("no-weight", USER_OP, rms_no_weight, "float32", note="weight not applied"),
)


@dataclass(frozen=True)
class Case:
    """One op on one shape and dtype: a region for the built-ins, dispatch inputs' shape
    (rows, n) for the user op."""

    op: str
    shape: tuple[int, ...]
    dtype: str

    def label(self) -> str:
        return f"{self.op} {'x'.join(map(str, self.shape))} {self.dtype}"


FULL_SHAPES: dict[str, tuple[tuple[int, ...], ...]] = {
    "matmul": ((64, 64, 64), (65, 33, 512), (40, 24, 4096), (256, 256, 4096)),
    "softmax": ((8, 300), (3, 33), (64, 1000), (2, 3, 4097)),
    USER_OP: ((8, 4096), (33, 1000)),
}
SWEEP_SHAPES: dict[str, tuple[tuple[int, ...], ...]] = {
    "matmul": ((64, 64, 64), (65, 33, 512), (40, 24, 4096)),
    "softmax": ((3, 33), (64, 1000), (2, 3, 4097)),
    USER_OP: ((8, 4096),),
}
QUICK_SHAPES: dict[str, tuple[tuple[int, ...], ...]] = {
    "matmul": ((24, 16, 40), (33, 17, 300)),
    "softmax": ((3, 33), (4, 300)),
    USER_OP: ((4, 300),),
}


# -- user ops of one's own: the ops, their tests' inputs and their gate_inputs -------------

def _eps_of(dtype: np.dtype) -> float:
    import ml_dtypes

    return float(ml_dtypes.finfo(dtype).eps)


def _like(values: np.ndarray, like: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(values).astype(like.dtype)


def _big(dtype: np.dtype) -> float:
    """A large magnitude for gate inputs: 2^10 in 16-bit types (squares stay finite in
    float16), 2^20 in float32."""
    return 2.0 ** (10 if dtype.itemsize == 2 else 20)


def ln_dispatch(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
                ) -> tuple[Any, ...]:
    rows, n = shape
    x = (rng.standard_normal(shape) + 0.5 * rng.standard_normal((rows, 1))) * np.exp2(
        rng.integers(-2, 3, (rows, 1)))
    w = 1.0 + 0.1 * rng.standard_normal(n)
    b = 0.1 * rng.standard_normal(n)
    return x.astype(dtype), w.astype(dtype), b.astype(dtype), LN_EPS


def ln_harder(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """Large magnitudes (rows scaled toward 2^10 or 2^20), a row mean of 8 standard
    deviations, and rows of 4096."""
    x, w, b, eps = inputs
    fresh = rng.standard_normal(x.shape)
    long_n = 4096
    wl = _like(1.0 + 0.1 * rng.standard_normal(long_n), w)
    bl = _like(0.1 * rng.standard_normal(long_n), b)
    return [(_like(fresh * _big(x.dtype), x), w, b, eps),
            (_like(fresh + 8.0, x), w, b, eps),
            (_like(rng.standard_normal((4, long_n)), x), wl, bl, eps)]


def lse_dispatch(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
                 ) -> tuple[Any, ...]:
    return (_like(2.0 * rng.standard_normal(shape), np.empty(0, dtype)),)


def lse_harder(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """Logits near 500, rows offset by 100 x row, and rows of 4097."""
    (x,) = inputs
    rows = np.arange(x.shape[0])[:, None]
    return [(_like(rng.standard_normal(x.shape) * 30 + 500, x),),
            (_like(rng.standard_normal(x.shape) * 3 + 100.0 * rows, x),),
            (_like(2.0 * rng.standard_normal((x.shape[0], 4097)), x),)]


def cs_dispatch(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
                ) -> tuple[Any, ...]:
    return (_like(rng.standard_normal(shape), np.empty(0, dtype)),)


def cs_harder(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """The docs' example: rows of 1000 and 4097."""
    (x,) = inputs
    return [(_like(rng.standard_normal((x.shape[0], n)), x),) for n in (1000, 4097)]


def conv_dispatch(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
                  ) -> tuple[Any, ...]:
    rows, n, k = shape
    like = np.empty(0, dtype)
    return (_like(rng.standard_normal((rows, n)), like),
            _like(rng.standard_normal(k) / np.sqrt(k), like))


def conv_harder(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """Signals of 4097 samples, and large magnitudes."""
    x, w = inputs
    return [(_like(rng.standard_normal((x.shape[0], 4097)), x), w),
            (_like(rng.standard_normal(x.shape) * _big(x.dtype), x), w)]


def attn_dispatch(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
                  ) -> tuple[Any, ...]:
    lq, lk, d = shape
    like = np.empty(0, dtype)
    return (_like(rng.standard_normal((lq, d)), like), _like(rng.standard_normal((lk, d)), like),
            _like(rng.standard_normal((lk, d)), like))


def attn_harder(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """300 keys, and queries and keys scaled by 6 (scores of standard deviation 36)."""
    q, k, v = inputs
    d = q.shape[1]
    return [(q, _like(rng.standard_normal((300, d)), k), _like(rng.standard_normal((300, d)), v)),
            (_like(6 * rng.standard_normal(q.shape), q), _like(6 * rng.standard_normal(k.shape), k),
             v)]


def am_dispatch(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
                ) -> tuple[Any, ...]:
    return (_like(rng.standard_normal(shape), np.empty(0, dtype)),)


def am_harder(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """Rows of 4097, ties (values on a grid of 1/4), large magnitudes."""
    (x,) = inputs
    return [(_like(rng.standard_normal((x.shape[0], 4097)), x),),
            (_like(np.round(4 * rng.standard_normal(x.shape)) / 4, x),),
            (_like(rng.standard_normal(x.shape) * _big(x.dtype), x),)]


def pd_dispatch(shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator
                ) -> tuple[Any, ...]:
    n, m, d = shape
    like = np.empty(0, dtype)
    return (_like(rng.standard_normal((n, d)), like), _like(rng.standard_normal((m, d)), like))


def pd_harder(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """Near points (y a copy of x's rows moved by a few units of rounding, one row
    exactly equal), then the same around an offset of 100."""
    x, y = inputs
    m = min(y.shape[0], x.shape[0])
    eps = _eps_of(x.dtype)
    out = []
    for offset in (0.0, 100.0):
        base = _like(rng.standard_normal(x.shape) + offset, x)
        near = base[:m].astype(np.float64) * (1 + 4 * eps * rng.standard_normal((m, x.shape[1])))
        near = _like(near, x)
        near[0] = base[0]
        out.append((base, near))
    return out


@dataclass(frozen=True)
class UserOp:
    """A user's own op: its reference, how its tests call it (``dispatch(shape, dtype,
    rng)``), and the ``gate_inputs`` its author would give (``harder``)."""

    name: str
    reference: Callable[..., np.ndarray]
    dispatch: Callable[[tuple[int, ...], np.dtype, np.random.Generator], tuple[Any, ...]]
    harder: Callable[[tuple[Any, ...], np.random.Generator], list[tuple[Any, ...]]]
    shapes: tuple[tuple[int, ...], ...]
    quick: tuple[tuple[int, ...], ...]
    what: str = ""


USER_OPS: tuple[UserOp, ...] = (
    UserOp("bench_layernorm", ln_reference, ln_dispatch, ln_harder, ((16, 768), (5, 300)),
           ((5, 300),), "rows x n, eps a Python float"),
    UserOp("bench_logsumexp", lse_reference, lse_dispatch, lse_harder, ((8, 300), (33, 1000)),
           ((8, 300),), "rows x n"),
    UserOp("bench_cumsum", cs_reference, cs_dispatch, cs_harder, ((8, 256), (4, 1000)),
           ((8, 256),), "rows x n"),
    UserOp("bench_conv1d", conv_reference, conv_dispatch, conv_harder, ((4, 256, 7), (3, 500, 31)),
           ((4, 256, 7),), "rows x n x taps"),
    UserOp("bench_attention", attn_reference, attn_dispatch, attn_harder,
           ((32, 48, 16), (17, 64, 32)), ((32, 48, 16),), "queries x keys x d"),
    UserOp("bench_argmax", am_reference, am_dispatch, am_harder, ((8, 300), (33, 1000)),
           ((8, 300),), "rows x n"),
    UserOp("bench_pdist", pd_reference, pd_dispatch, pd_harder, ((32, 24, 16), (50, 20, 40)),
           ((32, 24, 16),), "n x m x d"),
)

_LN, _LSE, _CS, _CONV, _ATTN, _AM, _PD = (u.name for u in USER_OPS)
F32_ONLY = ("float32",)

USER_VARIANTS: tuple[Variant, ...] = (
    Variant("two-pass", _LN, ln_two_pass),
    Variant("float64", _LN, ln_f64),
    Variant("welford", _LN, ln_welford),
    Variant("welford-32", _LN, ln_welford_blocks),
    Variant("rsqrt-seq", _LN, ln_rsqrt),
    Variant("one-pass-var", _LN, ln_one_pass, "two-pass", note="var = E[x^2] - E[x]^2"),
    Variant("unbiased", _LN, ln_unbiased, "two-pass", note="variance over n - 1"),
    Variant("eps-outside", _LN, ln_eps_outside, "two-pass", note="1 / (std + eps)"),
    Variant("no-eps", _LN, ln_no_eps, "two-pass", note="eps dropped"),
    Variant("var-narrow", _LN, ln_var_narrow, "two-pass", note="squares summed in the narrow type"),
    Variant("affine-order", _LN, ln_affine_order, "two-pass", note="(x_hat + b) * w"),
    Variant("trunc-out", _LN, ln_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("two-pass", _LSE, lse_two_pass),
    Variant("float64", _LSE, lse_f64),
    Variant("sequential", _LSE, lse_sequential),
    Variant("online-32", _LSE, lse_online),
    Variant("exp2", _LSE, lse_exp2),
    Variant("no-max", _LSE, lse_no_max, "two-pass", note="no max shift"),
    Variant("global-max", _LSE, lse_global_max, "two-pass", note="max over all rows"),
    Variant("sum-narrow", _LSE, lse_sum_narrow, "two-pass", note="sum in the narrow type"),
    Variant("drop-tail", _LSE, lse_drop_tail, "two-pass", note="sum stops at a 32-tile"),
    Variant("trunc-out", _LSE, lse_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("sequential", _CS, cs_sequential),
    Variant("float64", _CS, cs_f64),
    Variant("blocked-64", _CS, cs_blocked),
    Variant("hillis-steele", _CS, cs_hillis_steele),
    Variant("exclusive", _CS, cs_exclusive, "sequential", note="exclusive scan"),
    Variant("acc-narrow", _CS, cs_narrow, "sequential", note="accumulated in the narrow type"),
    Variant("carry-2048", _CS, cs_carry, "blocked-64",
            note="block carry wrong past 2048 elements"),
    Variant("trunc-out", _CS, cs_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("im2col", _CONV, conv_gemm),
    Variant("float64", _CONV, conv_f64),
    Variant("taps", _CONV, conv_taps),
    Variant("taps-reversed", _CONV, conv_taps_reversed),
    Variant("fft", _CONV, conv_fft),
    Variant("flipped", _CONV, conv_flipped, "im2col", note="kernel flipped (convolution)"),
    Variant("halo-512", _CONV, conv_halo, "im2col", note="no halo past 512-output tiles"),
    Variant("tail-32", _CONV, conv_tail, "im2col", note="outputs past 32-tiles unwritten"),
    Variant("acc-narrow", _CONV, conv_narrow, "taps", note="accumulator in the narrow type"),
    Variant("trunc-out", _CONV, conv_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("standard", _ATTN, attn_standard),
    Variant("float64", _ATTN, attn_f64),
    Variant("late-divide", _ATTN, attn_late_divide),
    Variant("flash-64", _ATTN, attn_flash),
    Variant("flash-exp2", _ATTN, attn_flash_exp2),
    Variant("no-scale", _ATTN, attn_no_scale, "standard", note="1/sqrt(d) missing"),
    Variant("scale-1/d", _ATTN, attn_scale_d, "standard", note="1/d instead of 1/sqrt(d)"),
    Variant("no-max", _ATTN, attn_no_max, "standard", note="no max shift"),
    Variant("no-rescale", _ATTN, attn_no_rescale, "flash-64",
            note="accumulator not rescaled (> 64 keys)"),
    Variant("p-narrow", _ATTN, attn_p_narrow, "standard", dtypes=NARROW,
            note="P rounded to the input type before P V"),
    Variant("trunc-out", _ATTN, attn_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
    Variant("native", _AM, am_native),
    Variant("two-pass", _AM, am_two_pass),
    Variant("blocked-64", _AM, am_blocked),
    Variant("plus-one", _AM, am_plus_one, "native", note="index one too high"),
    Variant("last-tie", _AM, am_last_tie, "native", note="last index on ties"),
    Variant("nan-ignored", _AM, am_nan_ignored, "native", note="NaN skipped"),
    Variant("bf16-compare", _AM, am_narrow, "native", dtypes=F32_ONLY,
            note="compared in bfloat16"),
    Variant("abs", _AM, am_abs, "native", note="argmax of |x|"),
    Variant("direct", _PD, pd_direct),
    Variant("float64", _PD, pd_f64),
    Variant("sequential", _PD, pd_sequential),
    Variant("gemm", _PD, pd_gemm, "direct", note="|x|^2 + |y|^2 - 2 x.y"),
    Variant("no-sqrt", _PD, pd_no_sqrt, "direct", note="squared distances"),
    Variant("d-tail-16", _PD, pd_d_tail, "direct", note="features past 16-tiles dropped"),
    Variant("acc-narrow", _PD, pd_narrow, "direct", note="accumulator in the narrow type"),
    Variant("trunc-out", _PD, pd_trunc, "float64", dtypes=NARROW,
            note="output rounded toward zero"),
)


# -- running the checkers -----------------------------------------------------------------

def _candidate_class() -> type:
    from pytest_arbiter.core.candidates import Candidate

    class Recorder(Candidate):
        """Runs a kernel and keeps each output (or the exception), in the gate's order."""

        def __init__(self, variant: Variant, op: str) -> None:
            super().__init__(f"bench-{variant.op}-{variant.name}", op, "cpu")
            self.fn = variant.fn
            self.outputs: list[Any] = []

        def run(self, *inputs: Any) -> Any:
            try:
                out = self.fn(*inputs)
            except Exception as exc:
                self.outputs.append(exc)
                raise
            self.outputs.append(np.array(out, copy=True))
            return out

    return Recorder


def _user_op() -> Any:
    from pytest_arbiter.core.ops import make_op

    return make_op(USER_OP, rms_reference)


def _user_inputs(shape: tuple[int, ...], dtype: str, seed: int) -> tuple[np.ndarray, ...]:
    from pytest_arbiter.core.dtypes import numpy_dtype

    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-2, 3, (shape[0], 1)))
    w = 1.0 + 0.1 * rng.standard_normal(shape[-1])
    return x.astype(numpy_dtype(dtype)), w.astype(numpy_dtype(dtype))


def _tolerance_ok(got: Any, want: np.ndarray, rtol: float, atol: float) -> bool:
    """``|got - want| <= atol + rtol |want|`` everywhere, non-finite values equal."""
    if isinstance(got, BaseException) or got.shape != want.shape:
        return False
    g = got.astype(np.float64)
    finite = np.isfinite(want)
    if not np.array_equal(np.where(finite, 0.0, g), np.where(finite, 0.0, want),
                          equal_nan=True):
        return False
    if not np.isfinite(g[finite]).all():
        return False
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.all(np.abs(g[finite] - want[finite]) <= atol + rtol * np.abs(want[finite])))


@dataclass
class Verdicts:
    """One kernel on one case: each checker's verdict and the outputs behind them."""

    rejected: dict[str, bool]
    outputs: list[Any]
    report: Any
    seconds: float


class Bench:
    """Runs kernels on cases, caching each case's inputs and reference outputs."""

    def __init__(self) -> None:
        from pytest_arbiter.core.ops import OPS

        self.ops = {"matmul": OPS.get("matmul"), "softmax": OPS.get("softmax"),
                    USER_OP: _user_op()}
        self.recorder = _candidate_class()
        self._refs: dict[tuple[Case, int], list[np.ndarray]] = {}

    def inputs(self, case: Case, seed: int) -> list[tuple[np.ndarray, ...]]:
        from pytest_arbiter.core.regions import MatmulRegion, SoftmaxRegion

        op = self.ops[case.op]
        if case.op == USER_OP:
            return [_user_inputs(case.shape, case.dtype, seed)]
        region = (MatmulRegion.of(*case.shape, case.dtype) if case.op == "matmul"
                  else SoftmaxRegion.of(case.shape, case.dtype))
        return list(op.gate_inputs(region, seed))

    def references(self, case: Case, seed: int) -> list[np.ndarray]:
        """The exact result of each input rounded to the case's dtype: what the tolerance
        checks compare against."""
        from pytest_arbiter.core.dtypes import round_to

        key = (case, seed)
        if key not in self._refs:
            op = self.ops[case.op]
            with np.errstate(all="ignore"):
                self._refs[key] = [round_to(np.asarray(op.exact(*t)), case.dtype)
                                   for t in self.inputs(case, seed)]
        return self._refs[key]

    def _user_references(self, op: Any, case: Case, seed: int, report: Any
                         ) -> list[np.ndarray]:
        """The exact results of the trials the gate ran the user op's kernel on (the
        dispatch's and the derived ones), rounded to the case's dtype."""
        from pytest_arbiter.core.dtypes import round_to

        trials = _user_trial_inputs(op, self.inputs(case, seed)[0], seed)
        ran = [t for t, r in zip(trials, report.trials, strict=True)
               if r.status not in ("skipped", "declined")]
        with np.errstate(all="ignore"):
            return [round_to(np.asarray(op.exact(*t)), case.dtype) for t in ran]

    def check(self, variant: Variant, case: Case, seed: int, *,
              baselines: bool = True) -> Verdicts:
        from pytest_arbiter.core.dtypes import numpy_dtype
        from pytest_arbiter.core.regions import MatmulRegion, SoftmaxRegion
        from pytest_arbiter.decision.gating import f4_gate

        op = self.ops[case.op]
        cand = self.recorder(variant, op.name)
        start = time.perf_counter()
        with np.errstate(all="ignore"):
            if case.op == USER_OP:
                report = f4_gate(cand, op, inputs=self.inputs(case, seed)[0], seed=seed)
            else:
                region = (MatmulRegion.of(*case.shape, case.dtype) if case.op == "matmul"
                          else SoftmaxRegion.of(case.shape, case.dtype))
                report = f4_gate(cand, op, region=region, seed=seed)
        seconds = time.perf_counter() - start
        rejected = {"F4": not report.passed}
        if baselines:
            want_dtype = numpy_dtype(case.dtype)
            refs = (self._user_references(op, case, seed, report) if case.op == USER_OP
                    else self.references(case, seed))
            outs = cand.outputs
            wrong = len(outs) != len(refs) or any(
                isinstance(o, BaseException) or o.dtype != want_dtype for o in outs)
            rtol, atol = TORCH_TOLERANCES[case.dtype]
            rejected["np.allclose"] = wrong or not all(
                _tolerance_ok(o, r, 1e-5, 1e-8) for o, r in zip(outs, refs, strict=True))
            rejected["torch"] = wrong or not all(
                _tolerance_ok(o, r, rtol, atol) for o, r in zip(outs, refs, strict=True))
        return Verdicts(rejected, cand.outputs, report, seconds)


def _user_trial_inputs(op: Any, own: tuple[np.ndarray, ...], seed: int
                      ) -> list[tuple[Any, ...]]:
    """The user op's gate inputs in the gate's order: the dispatch's, then the derived."""
    from pytest_arbiter.core.user_inputs import user_trials

    extra = user_trials(op.validate, op.user_gate_inputs, op.name, own, seed)
    return [own, *(t.inputs for t in extra)]


def _changed(mutant: list[Any], base: list[Any]) -> bool:
    """Whether the mutant's output differs, bit for bit, from its base's on some input."""
    for m, b in zip(mutant, base, strict=True):
        if isinstance(m, BaseException) or isinstance(b, BaseException):
            return True
        if m.shape != b.shape or m.dtype != b.dtype:
            return True
        if not np.array_equal(m.view(np.uint8), b.view(np.uint8)):
            return True
    return False


# -- the benchmark ------------------------------------------------------------------------

@dataclass
class Tally:
    """Counts per (checker, dtype) of caught mutants and rejected correct variants."""

    caught: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    live: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    equivalent: int = 0
    false_rejects: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    correct: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    by_kind: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    misses: list[str] = field(default_factory=list)
    false_reject_notes: list[str] = field(default_factory=list)
    gate_seconds: list[float] = field(default_factory=list)


def _cases(shapes: dict[str, tuple[tuple[int, ...], ...]], ops: Sequence[str],
           dtypes: Sequence[str]) -> list[Case]:
    return [Case(op, shape, dtype) for op in ops for shape in shapes[op] for dtype in dtypes]


def run_power(shapes: dict[str, tuple[tuple[int, ...], ...]], *, seed: int | None = None,
              dtypes: Sequence[str] = DTYPES, ops: Sequence[str] = ("matmul", "softmax", USER_OP),
              progress: Callable[[str], None] | None = None) -> Tally:
    """Every variant on every case at one gate seed, judged by the three checkers."""
    from pytest_arbiter.core.gate import GATE_SEED

    seed = GATE_SEED if seed is None else seed
    bench = Bench()
    tally = Tally()
    for case in _cases(shapes, ops, dtypes):
        base_out: dict[str, list[Any]] = {}
        variants = [v for v in VARIANTS if v.op == case.op and v.runs_on(case)]
        for variant in sorted(variants, key=lambda v: not v.correct):
            verdict = bench.check(variant, case, seed)
            if variant.correct:
                base_out[variant.name] = verdict.outputs
                tally.correct[case.dtype] += 1
                tally.gate_seconds.append(verdict.seconds)
                for checker, bad in verdict.rejected.items():
                    tally.false_rejects[(checker, case.dtype)] += bad
                if verdict.rejected["F4"]:
                    tally.false_reject_notes.append(
                        f"{case.label()} {variant.name}: {verdict.report.reason}")
                continue
            if not _changed(verdict.outputs, base_out[variant.base]):
                tally.equivalent += 1
                continue
            tally.live[case.dtype] += 1
            kind = tally.by_kind.setdefault((case.op, variant.name), [0, 0, 0, 0])
            kind[0] += 1
            for i, checker in enumerate(CHECKERS):
                caught = verdict.rejected[checker]
                tally.caught[(checker, case.dtype)] += caught
                kind[i + 1] += caught
            if not verdict.rejected["F4"]:
                tally.misses.append(f"{case.label()} {variant.name}")
        if progress is not None:
            progress(case.label())
    return tally


@dataclass
class Sweep:
    """The false-alarm sweep: every correct variant on many gate seeds, F4 only."""

    calls: int = 0
    rejects: list[str] = field(default_factory=list)
    worst_ratio: float = 0.0
    worst_bias: float = 0.0
    worst_spread: float = 0.0
    worst_where: dict[str, str] = field(default_factory=dict)
    worst_ratio_by: dict[tuple[str, str], float] = field(default_factory=dict)
    """The worst elementwise error/budget per (op, dtype): the margin of each budget."""


def run_sweep(shapes: dict[str, tuple[tuple[int, ...], ...]], seeds: int, *,
              dtypes: Sequence[str] = DTYPES,
              ops: Sequence[str] = ("matmul", "softmax", USER_OP),
              progress: Callable[[str], None] | None = None) -> Sweep:
    from pytest_arbiter.core.gate import GATE_SEED

    bench = Bench()
    sweep = Sweep()
    for case in _cases(shapes, ops, dtypes):
        for variant in VARIANTS:
            if variant.op != case.op or not variant.correct or not variant.runs_on(case):
                continue
            for s in range(seeds):
                verdict = bench.check(variant, case, GATE_SEED + 1000 * s, baselines=False)
                sweep.calls += 1
                report = verdict.report
                where = f"{case.label()} {variant.name} seed #{s}"
                if not report.passed:
                    sweep.rejects.append(f"{where}: {report.reason}")
                key = (case.op, case.dtype)
                sweep.worst_ratio_by[key] = max(sweep.worst_ratio_by.get(key, 0.0),
                                                report.worst_ratio)
                for trial in report.trials:
                    for attr, value in (("ratio", trial.worst_ratio), ("bias", trial.bias),
                                        ("spread", trial.spread)):
                        if value > getattr(sweep, f"worst_{attr}"):
                            setattr(sweep, f"worst_{attr}", value)
                            sweep.worst_where[attr] = f"{where} ({trial.input})"
        if progress is not None:
            progress(case.label())
    return sweep


USER_CHECKERS = ("F4", "F4+gate_inputs", "np.allclose", "torch")
USER_SEEDS = 20
"""Seeds of the user-op study (each a fresh dispatch input and gate seed); 2 with --quick."""


def register_user_ops() -> dict[str, tuple[Any, Any]]:
    """Each user op registered twice through the public ``pytest_arbiter.op``: as a user
    who gives no gate inputs would, and with its ``gate_inputs``."""
    import pytest_arbiter

    return {u.name: (pytest_arbiter.op(u.name, reference=u.reference),
                     pytest_arbiter.op(f"{u.name}_gi", reference=u.reference,
                                       gate_inputs=u.harder))
            for u in USER_OPS}


def _recording(variant: Variant, op_name: str) -> tuple[Any, list[tuple[tuple[Any, ...], Any]]]:
    """A public ``FunctionCandidate`` running ``variant``, and the log of what the gate ran
    it on: (inputs, output or the exception), in the gate's order."""
    from pytest_arbiter import FunctionCandidate

    log: list[tuple[tuple[Any, ...], Any]] = []

    def run(*inputs: Any) -> Any:
        kept = tuple(np.array(x, copy=True) if isinstance(x, np.ndarray) else x for x in inputs)
        try:
            out = variant.fn(*inputs)
        except Exception as exc:
            log.append((kept, exc))
            raise
        log.append((kept, np.array(out, copy=True)))
        return out

    cand = FunctionCandidate(run, f"bench-{op_name}-{variant.name}", op_name, "cpu", 0,
                             None, None)
    return cand, log


def _torch_tolerance(dtype: np.dtype) -> tuple[float, float]:
    """``torch.testing.assert_close``'s default (rtol, atol) for an output dtype: the
    float table, and 0, 0 (exact) for integer and boolean outputs."""
    if dtype.kind in "biu":
        return 0.0, 0.0
    return TORCH_TOLERANCES[dtype.name]


@dataclass
class UserTally:
    """The user-op study's counts, per (op, dtype) and per checker."""

    live: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    caught: dict[tuple[str, str, str], int] = field(default_factory=lambda: defaultdict(int))
    correct: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    false_rejects: dict[tuple[str, str, str], int] = field(
        default_factory=lambda: defaultdict(int))
    caught_either: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    """Mutants caught by F4 in one configuration or the other."""
    equivalent: int = 0
    by_kind: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    misses: dict[str, dict[str, int]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    """Per F4 configuration: how many runs of each (op, mutant, dtype) it passed."""
    false_reject_notes: list[str] = field(default_factory=list)
    gate_seconds: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


@dataclass
class _UserRun:
    """One kernel on one case and seed, in both configurations."""

    rejected: dict[str, bool]
    logs: tuple[list[Any], list[Any]]
    reasons: tuple[str, str]


def _user_run(variant: Variant, ops: tuple[Any, Any], inputs: tuple[Any, ...], seed: int,
              refs: list[np.ndarray] | None, tally: UserTally) -> tuple[_UserRun, list[np.ndarray]]:
    from pytest_arbiter import f4_gate
    from pytest_arbiter.core.dtypes import round_to

    rejected: dict[str, bool] = {}
    logs = []
    reasons = []
    for checker, op in zip(USER_CHECKERS[:2], ops, strict=True):
        cand, log = _recording(variant, op.name)
        start = time.perf_counter()
        with np.errstate(all="ignore"):
            report = f4_gate(cand, op, inputs=inputs, seed=seed)
        if variant.correct:
            tally.gate_seconds[checker].append(time.perf_counter() - start)
        rejected[checker] = not report.passed
        logs.append(log)
        reasons.append(report.reason)
    # the tolerance checks: against the exact result rounded to the output dtype, on the
    # dispatch's inputs and the gate_inputs' (the F4+gate_inputs run ran those first,
    # then the derived trials, which a tolerance check was never meant for)
    given = sum(t.input.startswith("gate_inputs #") for t in report.trials)
    ran = logs[1][:1 + given]
    if refs is None:
        refs = []
        with np.errstate(all="ignore"):
            for args, _ in ran:
                exact = np.asarray(ops[1].reference(*args))
                refs.append(exact if exact.dtype.kind in "biu"
                            else round_to(exact.astype(np.float64), args[0].dtype))
    want = refs[0].dtype if refs[0].dtype.kind in "biu" else ran[0][0][0].dtype
    wrong = len(ran) != len(refs) or any(
        isinstance(out, BaseException) or out.dtype != want for _, out in ran)
    outs = [out for _, out in ran]
    rtol, atol = _torch_tolerance(want)
    rejected["np.allclose"] = wrong or not all(
        _tolerance_ok(o, r, 1e-5, 1e-8) for o, r in zip(outs, refs, strict=True))
    rejected["torch"] = wrong or not all(
        _tolerance_ok(o, r, rtol, atol) for o, r in zip(outs, refs, strict=True))
    return _UserRun(rejected, (logs[0], logs[1]), (reasons[0], reasons[1])), refs


def run_user_power(*, quick: bool = False, seeds: int | None = None,
                   dtypes: Sequence[str] = DTYPES, names: Sequence[str] | None = None,
                   progress: Callable[[str], None] | None = None) -> UserTally:
    """Every user-op kernel on each of its test shapes, dtypes and seeds, gated through the
    public API with and without the op's ``gate_inputs``, beside the tolerance checks."""
    from pytest_arbiter.core.dtypes import numpy_dtype
    from pytest_arbiter.core.gate import GATE_SEED

    seeds = seeds if seeds is not None else (2 if quick else USER_SEEDS)
    registered = register_user_ops()
    tally = UserTally()
    for spec in USER_OPS:
        if names is not None and spec.name not in names:
            continue
        for shape, dtype in itertools.product(spec.quick if quick else spec.shapes, dtypes):
            case = Case(spec.name, shape, dtype)
            variants = sorted((v for v in USER_VARIANTS if v.op == spec.name
                               and v.runs_on(case)), key=lambda v: not v.correct)
            for s in range(seeds):
                seed = GATE_SEED + 1000 * s
                rng = np.random.default_rng([s, *shape, DTYPES.index(dtype)])
                inputs = spec.dispatch(shape, numpy_dtype(dtype), rng)
                refs: list[np.ndarray] | None = None
                bases: dict[str, _UserRun] = {}
                for variant in variants:
                    run, refs = _user_run(variant, registered[spec.name], inputs, seed, refs,
                                          tally)
                    where = f"{case.label()} seed #{s} {variant.name}"
                    key = (spec.name, dtype)
                    if variant.correct:
                        bases[variant.name] = run
                        tally.correct[key] += 1
                        for checker in USER_CHECKERS:
                            tally.false_rejects[(checker, *key)] += run.rejected[checker]
                        for checker, reason in zip(USER_CHECKERS[:2], run.reasons,
                                                   strict=True):
                            if run.rejected[checker]:
                                tally.false_reject_notes.append(
                                    f"{where} ({checker}): {reason}")
                        continue
                    base = bases[variant.base]
                    if not any(_changed_log(m, b) for m, b in zip(run.logs, base.logs,
                                                                  strict=True)):
                        tally.equivalent += 1
                        continue
                    tally.live[key] += 1
                    kind = tally.by_kind.setdefault((spec.name, variant.name), [0] * 5)
                    kind[0] += 1
                    for i, checker in enumerate(USER_CHECKERS):
                        tally.caught[(checker, *key)] += run.rejected[checker]
                        kind[i + 1] += run.rejected[checker]
                    tally.caught_either[key] += run.rejected["F4"] or run.rejected[
                        "F4+gate_inputs"]
                    for checker in USER_CHECKERS[:2]:
                        if not run.rejected[checker]:
                            what = f"{spec.name.removeprefix('bench_')} {variant.name} {dtype}"
                            tally.misses[checker][what] += 1
            if progress is not None:
                progress(case.label())
    return tally


def _changed_log(mutant: list[Any], base: list[Any]) -> bool:
    """Whether a mutant's outputs differ, bit for bit, from its base's on the same gate."""
    if len(mutant) != len(base):
        return True
    return _changed([out for _, out in mutant], [out for _, out in base])


def format_user_power(tally: UserTally) -> list[str]:
    """The table: per op and dtype, mutants caught / changing, and correct kernels
    rejected / run, for each checker."""
    head = ("| op | dtype | " + " | ".join(f"caught: {c}" for c in USER_CHECKERS) + " | "
            + " | ".join(f"false rejects: {c}" for c in USER_CHECKERS) + " |")
    lines = [head, "|" + "---|" * (2 + 2 * len(USER_CHECKERS))]
    keys = sorted(tally.correct, key=lambda k: ([u.name for u in USER_OPS].index(k[0]),
                                                DTYPES.index(k[1])))
    totals = [0] * (2 + 2 * len(USER_CHECKERS))

    def cells(live: int, correct: int, caught: list[int], false: list[int]) -> str:
        return " | ".join([*(f"{c}/{live}" for c in caught), *(f"{f}/{correct}" for f in false)])

    for key in keys:
        caught = [tally.caught[(c, *key)] for c in USER_CHECKERS]
        false = [tally.false_rejects[(c, *key)] for c in USER_CHECKERS]
        row = [tally.live[key], tally.correct[key], *caught, *false]
        totals = [t + r for t, r in zip(totals, row, strict=True)]
        lines.append(f"| {key[0].removeprefix('bench_')} | {key[1]} | "
                     + cells(row[0], row[1], caught, false) + " |")
    n = len(USER_CHECKERS)
    lines.append("| **all** | | " + cells(totals[0], totals[1], totals[2:2 + n], totals[2 + n:])
                 + " |")
    either = sum(tally.caught_either.values())
    lines += ["", f"caught by F4 without or with gate_inputs: {either}/{totals[0]}",
              f"{tally.equivalent} mutant runs left every output unchanged (equivalent, "
              "not counted)", "",
              "per mutant kind: caught / changing runs (F4, F4+gate_inputs, np.allclose, torch)"]
    notes = {(v.op, v.name): v.note for v in USER_VARIANTS}
    for (op, name), (count, *caught) in tally.by_kind.items():
        row = "  ".join(f"{c:>3d}" for c in caught)
        lines.append(f"  {op.removeprefix('bench_'):10s} {name:13s} {count:>3d}: {row}   "
                     f"{notes[(op, name)]}")
    for checker in USER_CHECKERS[:2]:
        if tally.misses[checker]:
            lines += ["", f"missed by {checker} (runs): " + ", ".join(
                f"{what} x{n}" for what, n in tally.misses[checker].items())]
    if tally.false_reject_notes:
        lines += ["", "correct kernels F4 rejected:",
                  *(f"  {t}" for t in tally.false_reject_notes)]
    for checker, spent in tally.gate_seconds.items():
        lines.append(f"{checker} gate call (correct kernels): median "
                     f"{statistics.median(spent) * 1e3:.1f} ms over {len(spent)}")
    return lines


def tf32_rows(shape: tuple[int, int, int]) -> list[str]:
    """The TF32 policy: a TF32 GEMM under the default float32 budget and once allowed."""
    from pytest_arbiter.core.gate import GATE_SEED
    from pytest_arbiter.core.ops import OPS, allow_tf32
    from pytest_arbiter.core.regions import MatmulRegion
    from pytest_arbiter.decision.gating import f4_gate

    recorder = _candidate_class()
    region = MatmulRegion.of(*shape, "float32")
    rows = []
    for allowed in (False, True):
        allow_tf32("matmul", "float32", allow=allowed)
        try:
            for variant in (Variant("tf32", "matmul", mm_tf32), Variant("blas", "matmul", mm_blas),
                            Variant("scale-1e-3", "matmul", mm_scaled)):
                report = f4_gate(recorder(variant, "matmul"), OPS.get("matmul"), region=region,
                                 seed=GATE_SEED)
                policy = "allow_tf32" if allowed else "default"
                verdict = "passes" if report.passed else f"rejected: {report.reason[:90]}"
                rows.append(f"  {policy:10s} {variant.name:11s} {verdict}")
        finally:
            allow_tf32("matmul", "float32", allow=False)
    return rows


def _timing_cases() -> list[tuple[str, str, tuple[int, ...], str]]:
    return [(op, name, shape, dtype) for dtype in DTYPES
            for op, name in (("matmul", "blas_matmul"), ("softmax", "stable_softmax"))
            for shape in FULL_SHAPES[op]]


def _gate_call(package: Any, op: str, name: str, shape: tuple[int, ...],
               dtype: str) -> Callable[[], Any]:
    """One gate call of a bundled CPU kernel through ``package`` (this tree's
    ``pytest_arbiter`` or an older one's), using only APIs every version of the gate has."""
    registry = package.CandidateRegistry()
    package.runtime.register_bundled(registry)
    cand, the_op = registry.get(name), package.OPS.get(op)
    region = (package.MatmulRegion.of(*shape, dtype) if op == "matmul"
              else package.SoftmaxRegion.of(shape, dtype))
    return lambda: package.f4_gate(cand, the_op, region=region)


def _import_tree(path: str, name: str = "pytest_arbiter_before") -> Any:
    """An older tree's ``pytest_arbiter`` (say ``git archive REV | tar -x -C DIR``),
    imported beside this one as ``name``: a renamed copy in a temp dir."""
    import importlib
    import re
    import shutil
    import tempfile
    from pathlib import Path

    root = Path(tempfile.mkdtemp(prefix="gate-power-before-"))
    target = root / name
    shutil.copytree(Path(path) / "pytest_arbiter", target)
    for source in target.rglob("*.py"):
        text = source.read_text()
        source.write_text(re.sub(r"\bpytest_arbiter\b", name, text))
    sys.path.insert(0, str(root))
    package = importlib.import_module(name)
    importlib.import_module(f"{name}.runtime")
    return package


class TimingRow(NamedTuple):
    """One case's median CPU seconds: a first gate of the region (nothing kept from an
    earlier gate), a gate of a region gated before (its trials kept), and the older
    tree's gate (``None`` without one)."""

    case: str
    cold: float
    warm: float
    before: float | None
    also: tuple[float, ...] = ()  # the cold gate of each ``--also`` tree


def _forgetter(package: Any) -> Callable[[], None]:
    """The tree's ``forget_region_trials`` (a no-op for a tree that keeps nothing)."""
    import importlib

    try:
        trials = importlib.import_module(f"{package.__name__}.core.trials")
    except ImportError:
        return lambda: None
    forget: Callable[[], None] = getattr(trials, "forget_region_trials", lambda: None)
    return forget


def gate_timing(rounds: int = 5, before: str | None = None,
                also: Sequence[str] = ()) -> list[TimingRow]:
    """CPU seconds (median of ``rounds``) of one gate call of a bundled CPU kernel per case
    (both ops, the three dtypes, the full shapes), this tree's cold and warm, the older
    tree's (at ``before``) and a cold one of each of ``also`` (more trees to compare with),
    all timed interleaved so a shared machine's load hits them alike. Cold: the region's
    kept trials are dropped before the call, untimed."""
    import importlib

    now = importlib.import_module("pytest_arbiter")
    importlib.import_module("pytest_arbiter.runtime")
    forget = _forgetter(now)
    old = _import_tree(before) if before else None
    old_forget = _forgetter(old) if old is not None else None
    others = [_import_tree(path, f"pytest_arbiter_also{i}") for i, path in enumerate(also)]
    rows: list[TimingRow] = []
    for op, name, shape, dtype in _timing_cases():
        call = _gate_call(now, op, name, shape, dtype)
        calls = [(call, forget), (call, None)]
        if old is not None:
            calls.append((_gate_call(old, op, name, shape, dtype), old_forget))
        calls += [(_gate_call(other, op, name, shape, dtype), _forgetter(other))
                  for other in others]
        times: list[list[float]] = [[] for _ in calls]
        for fn, _ in calls:
            fn()
        for _ in range(rounds):
            for (fn, before_call), spent in zip(calls, times, strict=True):
                if before_call is not None:
                    before_call()
                start = time.process_time()
                fn()
                spent.append(time.process_time() - start)
        label = f"{op} {'x'.join(map(str, shape))} {dtype}"
        medians = [statistics.median(t) for t in times]
        rows.append(TimingRow(label, medians[0], medians[1],
                              medians[2] if old is not None else None,
                              tuple(medians[len(medians) - len(others):])))
    return rows


def print_gate_timing(rows: Sequence[TimingRow]) -> None:
    """The rows, the medians over the cases and their ratios, and the largest ratio of a
    case (the target: the cold median within 1.2x of the older tree's, no case over 2x)."""
    has_old = all(r.before for r in rows)
    others = min((len(r.also) for r in rows), default=0)
    print(f"  {'case':30s} {'cold':>9s} {'warm':>9s}" + (
        f" {'before':>9s}  {'cold/before':>11s} {'warm/before':>11s}" if has_old else "")
        + "".join(f" {f'also{i}':>9s} {f'cold/also{i}':>10s}" for i in range(others)))
    for r in rows:
        line = f"  {r.case:30s} {r.cold * 1e3:6.2f} ms {r.warm * 1e3:6.2f} ms"
        if has_old and r.before:
            line += (f" {r.before * 1e3:6.2f} ms  x{r.cold / r.before:10.2f} "
                     f"x{r.warm / r.before:10.2f}")
        line += "".join(f" {t * 1e3:6.2f} ms x{r.cold / t:9.2f}" for t in r.also[:others])
        print(line)
    medians = {key: statistics.median(getattr(r, key) for r in rows) for key in ("cold", "warm")}
    print(f"median gate call over {len(rows)} cases (CPU time): cold {medians['cold'] * 1e3:.2f}"
          f" ms (the region's first gate), warm {medians['warm'] * 1e3:.2f} ms (gated before)")
    if has_old:
        old = statistics.median(r.before or 0.0 for r in rows)
        for key, median in medians.items():
            worst = max(rows, key=lambda r: getattr(r, key) / (r.before or 1.0))
            print(f"  {key}: ratio of the medians {median / old:.2f} (before "
                  f"{old * 1e3:.2f} ms); largest case ratio "
                  f"{getattr(worst, key) / (worst.before or 1.0):.2f} ({worst.case})")
    for i in range(others):
        other = statistics.median(r.also[i] for r in rows)
        worst = max(rows, key=lambda r: r.cold / r.also[i])
        print(f"  cold against also{i}: ratio of the medians {medians['cold'] / other:.2f} "
              f"(also{i} {other * 1e3:.2f} ms); largest case ratio "
              f"{worst.cold / worst.also[i]:.2f} ({worst.case})")


def _longer_rows(inputs: tuple[Any, ...], rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """docs/accuracy.md's second example: the rows at lengths 1000 and 4097."""
    (x,) = inputs
    return [(rng.standard_normal((x.shape[0], n)).astype(x.dtype),) for n in (1000, 4097)]


def _user_gate_call(package: Any, name: str, reference: Kernel, kernel: Kernel,
                    x: np.ndarray, gate_inputs: Any, regated: bool) -> Callable[[], Any]:
    """One gate call of a correct kernel of a user op (made with ``make_op``, not
    registered) on ``x``: the derived trials, ``gate_inputs``' if given and, with
    ``regated``, a large-magnitudes pattern of another key (a 33x1000 one) made for x's
    shapes, as a candidate rejected for overflow there gets (issue 27, point 7)."""
    from importlib import import_module

    make_op = import_module(f"{package.__name__}.core.ops").make_op
    the_op = make_op(name, reference, gate_inputs=gate_inputs)
    cand = import_module(f"{package.__name__}.core.candidates").FunctionCandidate(
        kernel, f"bench-{name}", name, "cpu", 0, None, None)
    if not regated:
        return lambda: package.f4_gate(cand, the_op, inputs=(x,))
    derived = import_module(f"{package.__name__}.core.user_inputs").derived_trials
    other = np.random.default_rng(1).standard_normal((33, 1000)).astype(x.dtype)
    pattern = derived((other,), 7)[1].recipe
    return lambda: package.f4_gate(cand, the_op, inputs=(x,), regate=(pattern,))


def user_gate_timing(rounds: int = 9, before: Any = None
                     ) -> list[tuple[str, float, float | None]]:
    """CPU seconds (median of ``rounds``) of a user-op gate call at the sizes of
    docs/accuracy.md's examples (8x300 float32 logsumexp; an 8x300 cumsum with its
    ``gate_inputs`` of rows of 1000 and 4097), with the derived trials and one re-gated
    pattern; beside it the older tree's call (``before``, a package), with the pattern
    too when its gate takes one (:func:`_regates`)."""
    import importlib

    now = importlib.import_module("pytest_arbiter")
    x = np.random.default_rng(0).standard_normal((8, 300)).astype(np.float32)
    cases = (("logsumexp 8x300 float32", lse_reference, lse_two_pass, None),
             ("cumsum 8x300 float32 +gate_inputs", cs_reference, cs_sequential,
              _longer_rows))
    rows: list[tuple[str, float, float | None]] = []
    if before is not None and not hasattr(_maybe_module(before, "core.ops"), "make_op"):
        before = None  # a tree from before user ops had gate inputs of their own
    for label, reference, kernel, gate_inputs in cases:
        name = f"bench_timing_{label.split()[0]}"
        calls = [_user_gate_call(now, name, reference, kernel, x, gate_inputs, True)]
        if before is not None:
            calls.append(_user_gate_call(before, name, reference, kernel, x, gate_inputs,
                                         _regates(before)))
        times = _timed(calls, rounds)
        rows.append((f"user op {label}", times[0], times[1] if before is not None else None))
    return rows


def _regates(package: Any) -> bool:
    """Whether a tree's gate takes re-gated patterns (then timed with one, as this one)."""
    import inspect

    return "regate" in inspect.signature(package.f4_gate).parameters


def _maybe_module(package: Any, name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(f"{package.__name__}.{name}")
    except ImportError:
        return None


def _timed(calls: Sequence[Callable[[], Any]], rounds: int) -> list[float]:
    """Each call's median CPU seconds over ``rounds``, the calls interleaved."""
    spent: list[list[float]] = [[] for _ in calls]
    for call in calls:
        call()
    for _ in range(rounds):
        for call, times in zip(calls, spent, strict=True):
            start = time.process_time()
            call()
            times.append(time.process_time() - start)
    return [statistics.median(t) for t in spent]


# -- printing -----------------------------------------------------------------------------

def _fraction(n: int, d: int) -> str:
    return f"{n}/{d} ({100.0 * n / d:.0f}%)" if d else "-"


def format_power(tally: Tally) -> list[str]:
    dtypes = [d for d in DTYPES if tally.correct.get(d)]
    width = 17
    lines = ["mutants caught, of those that change the output on some gate input",
             f"{'checker':13s}" + "".join(f"{d:>{width}s}" for d in [*dtypes, "all"])]
    total_live = sum(tally.live[d] for d in dtypes)
    for checker in CHECKERS:
        cells = [_fraction(tally.caught[(checker, d)], tally.live[d]) for d in dtypes]
        cells.append(_fraction(sum(tally.caught[(checker, d)] for d in dtypes), total_live))
        lines.append(f"{checker:13s}" + "".join(f"{c:>{width}s}" for c in cells))
    lines += ["", "correct kernels rejected",
              f"{'checker':13s}" + "".join(f"{d:>{width}s}" for d in [*dtypes, "all"])]
    total_correct = sum(tally.correct[d] for d in dtypes)
    for checker in CHECKERS:
        cells = [_fraction(tally.false_rejects[(checker, d)], tally.correct[d]) for d in dtypes]
        cells.append(_fraction(sum(tally.false_rejects[(checker, d)] for d in dtypes),
                               total_correct))
        lines.append(f"{checker:13s}" + "".join(f"{c:>{width}s}" for c in cells))
    lines += ["", f"{tally.equivalent} mutant runs left the output unchanged (equivalent, "
              "not counted)", "",
              "per mutant kind: caught / changing runs (F4, np.allclose, torch)"]
    notes = {(v.op, v.name): v.note for v in VARIANTS}
    for (op, name), (n, *caught) in sorted(tally.by_kind.items()):
        cells = "  ".join(f"{c:>3d}" for c in caught)
        lines.append(f"  {op:14s} {name:14s} {n:>3d}: {cells}   {notes[(op, name)]}")
    if tally.misses:
        lines += ["", "missed by F4: " + "; ".join(tally.misses)]
    if tally.false_reject_notes:
        lines += ["", "correct kernels F4 rejected:", *(f"  {t}" for t in tally.false_reject_notes)]
    return lines


def format_sweep(sweep: Sweep, seeds: int) -> list[str]:
    lines = [f"false-alarm sweep: {sweep.calls} F4 gate calls (every correct variant, "
             f"{seeds} gate seeds): {len(sweep.rejects)} false rejects",
             f"  worst elementwise error/budget {sweep.worst_ratio:.3g} "
             f"({sweep.worst_where.get('ratio', '-')})",
             f"  worst bias statistic/bound {sweep.worst_bias:.3g} "
             f"({sweep.worst_where.get('bias', '-')})",
             f"  worst spread statistic/bound {sweep.worst_spread:.3g} "
             f"({sweep.worst_where.get('spread', '-')})"]
    lines.append("  worst elementwise error/budget by op: " + ", ".join(
        f"{op} {dtype} {ratio:.3f}" for (op, dtype), ratio in sorted(sweep.worst_ratio_by.items())))
    lines += [f"  REJECTED {r}" for r in sweep.rejects]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the CI form: small shapes")
    parser.add_argument("--seeds", type=int, default=None,
                        help="gate seeds of the false-alarm sweep (default 20; 3 with --quick)")
    parser.add_argument("--timing", action="store_true",
                        help="only time the gate on the bundled kernels")
    parser.add_argument("--before", metavar="DIR",
                        help="with --timing: an older tree to time beside this one "
                             "(git archive REV | tar -x -C DIR)")
    parser.add_argument("--also", metavar="DIR", action="append", default=[],
                        help="with --timing: one more tree whose region's first gate is "
                             "timed in the same rounds (repeatable), say the tree before "
                             "a change, beside the --before tree a target names")
    parser.add_argument("--user", action="store_true",
                        help="only the user-op study (seven ops of one's own, gated with "
                             "and without gate_inputs)")
    parser.add_argument("--user-seeds", type=int, default=None,
                        help=f"seeds of the user-op study (default {USER_SEEDS}; 2 with "
                             "--quick)")
    args = parser.parse_args(argv)
    if args.timing:
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print_gate_timing(gate_timing(before=args.before, also=args.also))
        print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        old_tree = sys.modules.get("pytest_arbiter_before") if args.before else None
        print("user-op gate calls (derived trials, one re-gated pattern; before: without it "
              "if its gate takes none):")
        for label, seconds, old in user_gate_timing(before=old_tree):
            versus = f"   before {old * 1e3:8.2f} ms" if old else ""
            print(f"  {label:40s} {seconds * 1e3:8.2f} ms{versus}")
        return 0
    shapes = QUICK_SHAPES if args.quick else FULL_SHAPES
    seeds = args.seeds if args.seeds is not None else (3 if args.quick else 20)
    began = time.perf_counter()

    def progress(label: str) -> None:
        print(f"  ... {label} ({time.perf_counter() - began:.0f} s)", file=sys.stderr)

    user = run_user_power(quick=args.quick, seeds=args.user_seeds, progress=progress)
    user_seeds = args.user_seeds if args.user_seeds is not None else (
        2 if args.quick else USER_SEEDS)
    print(f"User ops of one's own, {user_seeds} seeds each (dispatch inputs and gate seed), "
          "gated through the public API without and with gate_inputs:")
    print("\n".join(format_user_power(tally=user)))
    if args.user:
        print(f"\n({time.perf_counter() - began:.0f} s)")
        return 0
    print()
    tally = run_power(shapes, progress=progress)
    print("Gate power benchmark: " + ", ".join(
        f"{op} {', '.join('x'.join(map(str, s)) for s in shapes[op])}" for op in shapes))
    print("\n".join(format_power(tally)))
    print(f"\nF4 gate time per call (correct variants): median "
          f"{statistics.median(tally.gate_seconds) * 1e3:.1f} ms over "
          f"{len(tally.gate_seconds)} calls")
    print("\nTF32 policy (float32 matmul 65x33x512):")
    print("\n".join(tf32_rows((65, 33, 512))))
    sweep = run_sweep(QUICK_SHAPES if args.quick else SWEEP_SHAPES, seeds, progress=progress)
    print()
    print("\n".join(format_sweep(sweep, seeds)))
    print(f"\n({time.perf_counter() - began:.0f} s)")
    return 0 if not sweep.rejects and not tally.false_reject_notes else 1


if __name__ == "__main__":
    sys.exit(main())
