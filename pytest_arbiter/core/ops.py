"""The op registry: each op's reference, input validation, regions, gate inputs and budget.

Validation runs before any candidate or reference touches the inputs (SPEC bug 2):
it reads only ``ndim``, ``shape`` and ``dtype``, so it works on NumPy and CuPy arrays
alike and allocates nothing.
"""

from __future__ import annotations

import difflib
import math
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from pytest_arbiter.core.candidates import REGISTRY, definition_site
from pytest_arbiter.core.dtypes import DTYPE_NAMES, dtype_name, numpy_dtype, precision
from pytest_arbiter.core.names import check_name
from pytest_arbiter.core.regions import MatmulRegion, Region, SoftmaxRegion
from pytest_arbiter.core.user_inputs import UserGateInputs, is_scalar
from pytest_arbiter.errors import UnknownOpWarning

Array = Any
Reference = Callable[..., Array]
BudgetFn = Callable[[Sequence[np.ndarray], np.ndarray], np.ndarray]

# Probabilistic rounding-error analysis (Higham & Mary, 2019): an inner product of
# length K has error at most lambda * sqrt(K) * u * sum|a_i b_i| with probability
# 1 - 2K exp(-lambda^2 / 2); lambda = 8 makes a false alarm practically impossible.
ERROR_LAMBDA = 8.0
TF32_UNIT_ROUNDOFF = 2.0 ** -11
"""TF32 keeps 10 of float32's 23 fraction bits: u = 2^-11 (round to nearest)."""


def _shape_of(x: Array) -> str:
    shape = getattr(x, "shape", None)
    return "x".join(str(d) for d in shape) if shape is not None else type(x).__name__


def _require_array(x: Array, what: str) -> None:
    if not all(hasattr(x, attr) for attr in ("shape", "dtype", "ndim")):
        raise ValueError(f"{what} must be an array with shape and dtype, got {type(x).__name__}")


def to_host(x: Array) -> np.ndarray:
    """A NumPy view or copy of ``x`` (CuPy arrays are copied from the device)."""
    if isinstance(x, np.ndarray):
        return x
    getter = getattr(x, "get", None)
    if callable(getter):
        return np.asarray(getter())
    return np.asarray(x)


def _like(result: np.ndarray, template: Array) -> Array:
    """Return ``result`` on the same kind of device as ``template``."""
    if isinstance(template, np.ndarray):
        return result
    module = type(template).__module__.split(".")[0]
    if module == "cupy":
        import cupy

        return cupy.asarray(result)
    return result


def _is_float(dtype: np.dtype) -> bool:
    """NumPy's floating dtypes and ml_dtypes' bfloat16 (without importing ml_dtypes)."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _dtype_of(x: Any) -> np.dtype:
    found = getattr(x, "dtype", None)
    if found is not None:
        return np.dtype(found)
    return np.asarray(x).dtype


def _resolve_dtype(name: str, dtype: Any) -> np.dtype:
    if isinstance(dtype, str) and dtype == "bfloat16":
        return numpy_dtype("bfloat16")
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"op {name!r}: out_dtype must be a dtype name or a NumPy dtype, "
                        f"got {dtype!r}") from None


def _origin(fn: Any) -> str:
    module = getattr(fn, "__module__", None) or "?"
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    return f"{module}.{qualname}"


def _reimported(old: Any, new: Any) -> bool:
    """Whether ``new`` is ``old``'s code from a fresh import of its module (pytester's
    in-process runs re-import a test module); two lambdas of one module are two."""
    return (_origin(old) == _origin(new)
            and getattr(old, "__globals__", None) is not getattr(new, "__globals__", None))


def _same_device_kind(x: Any, template: Any) -> bool:
    return type(x).__module__.split(".")[0] == type(template).__module__.split(".")[0]


@dataclass(frozen=True)
class Op:
    """A kind of work with one reference semantics.

    ``reference`` computes the result (for the built-in ops in the inputs' dtype; a user
    op's may compute in any precision, :meth:`run_reference` casts it to
    :func:`result_dtype`); ``exact`` returns the float64 ground truth the gate uses.
    ``out_dtype``, when set, is the dtype every output of the op must have.
    """

    name: str
    reference: Reference
    validate: Callable[..., None]
    region_of: Callable[..., Region]
    exact: Callable[..., np.ndarray]
    budget: BudgetFn
    gate_inputs: Callable[[Region, int], list[tuple[np.ndarray, ...]]] | None = None
    builtin: bool = False
    doc: str = field(default="", compare=False)
    out_dtype: np.dtype | None = None
    allow_tf32: frozenset[str] = frozenset()
    """The input dtypes for which a kernel may round its inputs to TF32 (see
    :func:`allow_tf32`); empty by default, so a float32 GEMM on TF32 fails the gate."""
    user_gate_inputs: UserGateInputs | None = None
    """A user op's ``gate_inputs(inputs, rng)``: extra input tuples made from one
    dispatch's inputs; ``None``: the gate derives its own (:mod:`pytest_arbiter.core.user_inputs`).
    Built-in ops generate theirs from a region (:attr:`gate_inputs`)."""

    def run_reference(self, *inputs: Array) -> Array:
        """The reference's result in :func:`result_dtype`, on the inputs' kind of device.

        This is what a dispatch returns when the reference runs.
        """
        out = self.reference(*inputs)
        if self.builtin:
            return out
        want = result_dtype(self, inputs, out)
        template = inputs[0] if inputs else out
        if _same_device_kind(out, template) and hasattr(out, "astype"):
            return out if np.dtype(out.dtype) == want else out.astype(want)
        return _like(np.asarray(to_host(out)).astype(want), template)


def result_dtype(op: Op, inputs: Sequence[Any], reference_out: Any) -> np.dtype:
    """The dtype a candidate's output must have for ``inputs``, given the reference's output.

    The op's declared ``out_dtype`` if any; else, when the reference output is floating
    point (bfloat16 included), the dtype of the first floating-point array input (a float64
    reference of float32 inputs expects float32; an index array before it does not count);
    else the reference output's own dtype (an argmax returning int64 stays int64).
    Built-in ops: the first input's dtype.
    """
    if op.out_dtype is not None:
        return op.out_dtype
    if op.builtin and inputs:
        return _dtype_of(inputs[0])
    ref = _dtype_of(reference_out)
    if _is_float(ref):
        first = _first_float(inputs)
        if first is not None:
            return first
    return ref


def _first_float(inputs: Sequence[Any]) -> np.dtype | None:
    """The dtype of the first floating-point array among ``inputs`` (numbers skipped)."""
    for x in inputs:
        found = getattr(x, "dtype", None)
        if found is not None and hasattr(x, "shape") and not is_scalar(x):
            dtype = np.dtype(found)
            if _is_float(dtype):
                return dtype
    return None


def compares_exactly(op: Op, out_dtype: np.dtype) -> bool:
    """Whether outputs of ``out_dtype`` must equal the reference's exactly: integer and
    boolean outputs under the default budget (a ``budget=`` of the op's own overrides)."""
    return op.budget is _default_budget and out_dtype.kind in "biu"


def _builtin_dtype(op_name: str, x: Array) -> str:
    """The dtype name of a built-in op's input; a clear ``ValueError`` for another."""
    try:
        return dtype_name(x.dtype)
    except (TypeError, ValueError):
        raise ValueError(
            f"{op_name} supports {', '.join(DTYPE_NAMES)} inputs, got {x.dtype} (a user op, "
            f"pytest_arbiter.op(...), takes any dtype its reference does)") from None


def _validate_matmul(*inputs: Array) -> None:
    if len(inputs) != 2:
        raise ValueError(f"matmul takes two arrays (A, B), got {len(inputs)}")
    a, b = inputs
    _require_array(a, "matmul A")
    _require_array(b, "matmul B")
    both = f"A is {_shape_of(a)}, B is {_shape_of(b)}"
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul needs 2-D A (MxK) and B (KxN): {both}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"matmul contraction mismatch: A is {_shape_of(a)} (K={a.shape[1]}) but "
            f"B is {_shape_of(b)} (K={b.shape[0]})"
        )
    if a.dtype != b.dtype:
        raise ValueError(f"matmul dtypes differ: A is {_shape_of(a)} {a.dtype}, "
                         f"B is {_shape_of(b)} {b.dtype}")
    _builtin_dtype("matmul", a)


def _matmul_region(a: Array, b: Array) -> MatmulRegion:
    return MatmulRegion.of(int(a.shape[0]), int(b.shape[1]), int(a.shape[1]),
                           dtype_name(a.dtype))


def _matmul_exact(a: Array, b: Array) -> np.ndarray:
    return np.matmul(to_host(a).astype(np.float64), to_host(b).astype(np.float64))


def _matmul_reference(a: Array, b: Array) -> Array:
    return _like(_matmul_exact(a, b).astype(a.dtype), a)


class ErrorScales(NamedTuple):
    """The statistical checks' terms at some outputs, in absolute units: ``sd`` bounds the
    scale (a standard deviation, or a sub-Gaussian scale) of the random part of the error
    that is independent from output to output; ``common`` that of a random part shared by
    a group of outputs (a softmax row's sum); ``systematic`` an error of one sign that a
    correct kernel may still make (a biased library ``exp``, TF32 truncation)."""

    sd: np.ndarray
    common: np.ndarray
    systematic: np.ndarray


@dataclass(frozen=True)
class ErrorModel:
    """How far a correct kernel's output may be from the exact result, per output element.

    ``allowed`` (the output's shape, float64, absolute) is the elementwise budget;
    ``scales(flat_indices)`` the statistical checks' terms at those outputs (computed
    only where the gate samples them); ``group_size`` > 0 says the flattened outputs come
    in consecutive groups of that many sharing the ``common`` error (a softmax row), 0
    that none do; ``flush`` the part of ``allowed`` that flush-to-zero may use up.
    docs/accuracy.md derives each op's terms.
    """

    allowed: np.ndarray
    scales: Callable[[np.ndarray], ErrorScales]
    group_size: int = 0
    flush: float = 0.0
    """What flushing float32 subnormals to zero may cost an output (absolute): the outputs
    it could move by a visible fraction of their spacing are left out of the checks."""


def _finite_or_zero(values: np.ndarray) -> np.ndarray:
    finite = np.isfinite(values)
    return values if bool(finite.all()) else np.where(finite, values, 0.0)


_EXPONENT_BITS = np.uint64(0x7FF0000000000000)


def _with_rounding(magnitude: np.ndarray, accumulated: np.ndarray, flush: float,
                   dtype: object) -> np.ndarray:
    """The elementwise budget around an accumulated error bound.

    A correct kernel's value before its last rounding lies within ``accumulated`` of the
    exact result (of absolute value ``magnitude``); rounding it to nearest adds at most
    half a spacing of the output's numbers at that value (:func:`~pytest_arbiter.core.dtypes.
    spacing`). ``flush``: what flushing float32 subnormals to zero (a GPU compile option)
    may cost. A float64 reference was computed in float64 itself: it carries the same
    accumulated error and a rounding of its own.
    """
    p = precision(dtype)
    rounding = p.unit_roundoff  # half a spacing is u 2^floor(log2 v)
    if p.name == "float64":
        accumulated, rounding = 2.0 * accumulated, 2.0 * rounding
    out = magnitude + accumulated
    np.maximum(out, p.smallest_normal, out=out)
    bits = out.view(np.uint64)
    bits &= _EXPONENT_BITS  # now 2^floor(log2 v): v's float64 bits, fraction cleared
    out *= rounding
    out += accumulated
    out += flush
    return out


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
    finite = bool(np.isfinite(x).all()) and bool(np.isfinite(y).all())
    if not finite:
        x, y = (np.where(np.isfinite(v), v, 0.0).astype(v.dtype) for v in (x, y))
    top = max(float(x.max(initial=0.0)), float(y.max(initial=0.0)))
    low = min(float(np.min(x, initial=np.inf, where=x > 0)),
              float(np.min(y, initial=np.inf, where=y > 0)))
    if top > 2.0 ** 25 or low < 2.0 ** -25 or k > 1 << 20 or x.dtype != np.float32:
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        out: np.ndarray = np.matmul(x64 ** power, y64 ** power)
        return out * (1.0 + 2.0 * (k + 2) * 2.0 ** -53)
    fast = np.matmul(x ** power, y ** power).astype(np.float64)
    return fast * (1.0 + 2.0 * (k + 2) * 2.0 ** -24)


def _matmul_model(inputs: Sequence[np.ndarray], exact: np.ndarray, *, generated: bool,
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
    magnitude = np.abs(_finite_or_zero(exact))
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
    return ErrorModel(_with_rounding(magnitude, accumulated, flush, dtype), scales,
                      flush=flush)


def _matmul_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    return _matmul_model(inputs, exact, generated=False).allowed


def _matmul_budget_tf32(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    return _matmul_model(inputs, exact, generated=False, tf32=True).allowed


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    return values.astype(numpy_dtype(dtype), copy=False)


def _ragged(d: int) -> int:
    return d + 1 if d % 2 == 0 else d


TAILS = ((127, 1, 127), (1, 127, 73))
"""The tails of the ragged-tail inputs past a multiple of 128, per trial, for matmul's
(M, N, K) and (first two) softmax's last axis: 127 leaves the largest remainder at every
tile size 8 to 128 (7, 15, ..., 127), 1 the smallest, 73 a middling one (1, 9, 9, 9, 73)."""


def _tail(d: int, r: int) -> int:
    return (128 if d >= 128 else 0) + r


def _reduced_k(k: int) -> int:
    """A K of at most 511 with ``k``'s alignment up to 256 (for the inputs whose point is
    their values, not the length of the sums)."""
    return k if k <= 256 else 256 + k % 256


class GateInputs(list[tuple[np.ndarray, ...]]):
    """An op's generated gate inputs in order, each with a name saying what it probes."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def add(self, name: str, *arrays: np.ndarray) -> None:
        self.append(tuple(arrays))
        self.names.append(name)


def _draw_dtype(dtype: str) -> type[np.floating[Any]]:
    """Random values for a float64 region are drawn in float64; for narrower ones float32
    draws (twice as fast) are exact in the target after the cast anyway."""
    return np.float64 if dtype == "float64" else np.float32


def _matmul_gate_inputs(region: Region, seed: int) -> GateInputs:
    assert isinstance(region, MatmulRegion)
    m, n, k, dtype = region.m, region.n, region.k, region.dtype
    small = numpy_dtype(dtype).itemsize == 2
    scale_exp = 3 if small else 8
    offset = 4.0 if small else 16.0
    draw = _draw_dtype(dtype)
    out = GateInputs()

    def pair(name: str, a: np.ndarray, b: np.ndarray) -> None:
        out.add(name, _cast(a, dtype), _cast(b, dtype))

    def normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
        return rng.standard_normal(shape, dtype=draw)

    rng = np.random.default_rng(seed)
    pair("N(0, 1), the region's shape", normal(rng, (m, k)), normal(rng, (k, n)))
    # all-positive sums grow steadily, so a low-precision accumulator stagnates
    rng = np.random.default_rng(seed + 1)
    pair("all-positive U[0, 1): a narrow accumulator stagnates",
         rng.random((m, k), dtype=draw), rng.random((k, n), dtype=draw))
    rng = np.random.default_rng(seed + 2)
    tm, tn, tk = _ragged(m), _ragged(n), _ragged(k)
    pair("ragged neighbour: every even dimension + 1", normal(rng, (tm, tk)),
         normal(rng, (tk, tn)))
    rng = np.random.default_rng(seed + 3)
    a = normal(rng, (m, k)) * np.exp2(rng.integers(-scale_exp, scale_exp + 1, (m, 1)))
    b = normal(rng, (k, n)) * np.exp2(rng.integers(-scale_exp, scale_exp + 1, (1, n)))
    pair(f"mixed magnitudes: rows of A, columns of B scaled by 2^+-{scale_exp}", a, b)
    for j, tails in enumerate(TAILS):
        tm, tn, tk = (_tail(d, r) for d, r in zip((m, n, k), tails, strict=True))
        rng = np.random.default_rng(seed + 4 + j)
        pair(f"ragged tails {tm}x{tn}x{tk}: M, N, K past multiples of 8 to 128",
             normal(rng, (tm, tk)), normal(rng, (tk, tn)))
    ks = _reduced_k(k)
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


def _validate_softmax(*inputs: Array) -> None:
    if len(inputs) != 1:
        raise ValueError(f"softmax takes one array, got {len(inputs)}")
    (x,) = inputs
    _require_array(x, "softmax input")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"softmax needs an array with a non-empty last axis, got {_shape_of(x)}")
    _builtin_dtype("softmax", x)


def _softmax_region(x: Array) -> SoftmaxRegion:
    return SoftmaxRegion.of(tuple(int(d) for d in x.shape), dtype_name(x.dtype))


def _softmax_exact(x: Array) -> np.ndarray:
    x64 = to_host(x).astype(np.float64)
    shifted = x64 - x64.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def _softmax_reference(x: Array) -> Array:
    return _like(_softmax_exact(x).astype(x.dtype), x)


def _records_bound(n: int, generated: bool) -> int:
    """How often a running maximum may rise along a row (an online softmax rescales its sum
    each time): any number for arbitrary data; for i.i.d. data (the gate's own) the count
    of records, mean H_n, stays below 3 H_n + 14 but with probability < 1e-12 (Chernoff)."""
    if not generated or n < 2:
        return max(n - 1, 0)
    harmonic = math.log(n) + 0.5772156649 + 1.0 / (2 * n)
    return min(n - 1, math.ceil(3.0 * harmonic + 14.0))


def _softmax_model(inputs: Sequence[np.ndarray], exact: np.ndarray, *,
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
    if np.isfinite(y).all() and np.isfinite(x).all():
        top = x.max(axis=-1, keepdims=True)
        span = top - x.min(axis=-1, keepdims=True)
        t = top - x
    else:
        finite = np.isfinite(x)
        top = np.max(np.where(finite, x, -np.inf), axis=-1, keepdims=True)
        span = top - np.min(np.where(finite, x, np.inf), axis=-1, keepdims=True)
        top, span = (np.where(np.isfinite(top), v, 0.0) for v in (top, span))
        t = np.where(finite, top - x, 0.0)
        y = np.where(np.isfinite(y), y, 0.0)
    # the row's sum s = exp(0) / y at its maximum: log s without another exp
    with np.errstate(divide="ignore"):
        log_total = -np.log(y.max(axis=-1, keepdims=True))
    log_total = np.where(np.isfinite(log_total), np.maximum(log_total, 0.0), 0.0)
    shared = math.sqrt(n) + 5.0 + 5.0 * math.sqrt(_records_bound(n, generated))
    # relative: u_acc (8 + 2 |x - max| + 2 log s + 8 shared + range), in place
    relative = t * 2.0
    relative += 8.0 + ERROR_LAMBDA * shared + 2.0 * log_total + span
    relative *= u_acc
    flush = 2.0 * p.accumulate_smallest_normal
    allowed = _with_rounding(y, relative * y, flush, dtype)

    def scales(index: np.ndarray) -> ErrorScales:
        row = index // max(n, 1)
        at = y.reshape(-1)[index]
        argument = 2.0 * t.reshape(-1)[index] + 2.0 * log_total.reshape(-1)[row]
        return ErrorScales(u_acc * (4.0 + argument) * at,
                           u_acc * (shared + span.reshape(-1)[row]) * at,
                           8.0 * u_acc * at)

    return ErrorModel(allowed, scales, group_size=n, flush=flush)


def _softmax_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    return _softmax_model(inputs, exact, generated=False).allowed


def _softmax_gate_inputs(region: Region, seed: int) -> GateInputs:
    assert isinstance(region, SoftmaxRegion)
    shape, dtype = region.shape, region.dtype
    n, lead = shape[-1], shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    offset = 3000.0 if numpy_dtype(dtype).itemsize == 2 else 1000.0
    ragged = (*shape[:-1], _ragged(shape[-1])) if len(shape) == 1 else (
        _ragged(shape[0]), *shape[1:-1], _ragged(shape[-1]))
    # the tails are about the last axis: a few rows do
    inner = int(np.prod(lead[1:], dtype=np.int64))
    tail_lead = lead if rows <= 8 else (max(1, 8 // max(inner, 1)), *lead[1:])
    draw = _draw_dtype(dtype)
    out = GateInputs()

    def one(name: str, x: np.ndarray) -> None:
        out.add(name, _cast(x, dtype))

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
        tail = _tail(n, tails[0])
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


_MIN_TERMS = 64
"""The default budget's shortest accumulation: ``8 sqrt(64) = 64`` units of ``u_acc``."""
_VARIED = 8
"""Fewer distinct values than this among 32 evenly spaced ones: an input that repeats."""


def _float_arrays(inputs: Sequence[Any]) -> list[Any]:
    return [x for x in inputs
            if not is_scalar(x) and hasattr(x, "dtype") and _is_float(_dtype_of(x))]


def accumulation_length(inputs: Sequence[Any]) -> int:
    """How many terms a user op's output may accumulate, for its default budget: the
    longest axis of its floating-point array inputs (a row's reduction or scan, a
    convolution's signal, attention's keys); 1 without one."""
    return int(max((max(np.shape(x), default=1) for x in _float_arrays(inputs)), default=1))


def _values_repeat(arrays: Sequence[Any]) -> bool:
    """Whether every floating-point input repeats its values (fewer than 8 distinct finite
    ones among 32 evenly spaced): a constant, a mask, a coarse grid."""
    for x in arrays:
        flat = np.asarray(to_host(x)).reshape(-1)
        sample = flat[::max(1, flat.size // 32)][:32].astype(np.float64)
        if np.unique(sample[np.isfinite(sample)]).size >= _VARIED:
            return False
    return True


def _accumulation_units(inputs: Sequence[Any]) -> float:
    """The default budget's accumulated error in units of ``u_acc max|ref|``, for an
    ``n``-term accumulation whose partial sums stay within the largest output (a scan's
    partial sums are its outputs; a normalisation's relative error is its sum's), ``n`` the
    :func:`accumulation_length`: ``8 sqrt(max(n, 64))``, the probabilistic bound (Higham &
    Mary, λ = 8) for rounding errors that are independent and average zero. When every
    floating-point input repeats its values, whose sums round alike at every step, it is
    ``max(n, 64)``, the worst-case bound (docs/accuracy.md, "User ops")."""
    terms = max(accumulation_length(inputs), _MIN_TERMS)
    floats = _float_arrays(inputs)
    if floats and terms > _MIN_TERMS and _values_repeat(floats):
        return float(terms)
    return ERROR_LAMBDA * math.sqrt(terms)


def _default_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    first = _first_float(inputs)
    p = precision(first if first is not None else np.float64)
    scale = float(np.max(np.abs(exact))) if exact.size else 0.0
    return 2.0 * p.unit_roundoff * np.abs(exact) + (
        _accumulation_units(inputs) * p.accumulate_unit_roundoff * scale + p.smallest_normal)


def _default_model(inputs: Sequence[Any], exact: np.ndarray, out_dtype: str,
                   reference_dtype: str) -> ErrorModel:
    """The default budget of a user op whose reference computes in a wider precision than
    its output: the exact result rounded once to the output dtype (half an ulp), the
    reference's own rounding, and the accumulated error of :func:`_accumulation_units`,
    as for :func:`_default_budget`; a float32 flush-to-zero is allowed as for the
    built-ins."""
    p = precision(out_dtype)
    magnitude = np.abs(_finite_or_zero(exact))
    scale = float(np.max(magnitude)) if magnitude.size else 0.0
    accumulated = _accumulation_units(inputs) * p.accumulate_unit_roundoff * scale + (
        precision(reference_dtype).unit_roundoff * magnitude)
    flush = 2.0 * p.accumulate_smallest_normal
    allowed = _with_rounding(magnitude, accumulated, flush, out_dtype)

    def scales(index: np.ndarray) -> ErrorScales:
        # the whole accumulated allowance is the random part's scale, not an eighth of
        # it: the default budget bounds errors of a shape it does not know (a scan's
        # outputs share theirs, a long sum of one sign leans a little)
        return ErrorScales(accumulated.reshape(-1)[index], np.zeros(index.shape),
                           np.zeros(index.shape))

    return ErrorModel(allowed, scales, flush=flush)


_USER_KINDS = "biuf"
"""Array dtype kinds a user op takes: boolean, integer, unsigned, floating (and bfloat16)."""


def _generic_validate(*inputs: Array) -> None:
    """A user op's inputs: arrays of boolean, integer or floating dtype, or plain numbers
    (``bool``, ``int``, ``float``: passed to the kernels as they are)."""
    for i, x in enumerate(inputs):
        if is_scalar(x):
            continue
        if not all(hasattr(x, attr) for attr in ("shape", "dtype", "ndim")):
            raise ValueError(f"input {i} must be an array with shape and dtype or a plain "
                             f"number (bool, int, float), got {type(x).__name__}")
        dtype = np.dtype(x.dtype)
        if dtype.kind not in _USER_KINDS and dtype.name != "bfloat16":
            raise ValueError(f"input {i}: unsupported dtype {dtype}; a user op takes "
                             "boolean, integer and floating-point arrays and plain numbers")


def input_label(x: Array) -> str:
    """One input's part of a user op's key dtype: the array's dtype name (``float32``,
    ``int64``, ``bool``), or ``py_float`` / ``py_int`` / ``py_bool`` for a plain number."""
    if is_scalar(x):
        return f"py_{type(x).__name__}"
    found = getattr(x, "dtype", None)
    return str(np.dtype(found).name if found is not None else np.asarray(x).dtype.name)


def inputs_label(inputs: Sequence[Array]) -> str:
    """A user op's key dtype: the inputs' one dtype when they share it, else each input's
    in order, comma-separated (``float32,int64,py_float``)."""
    labels = [input_label(x) for x in inputs]
    if not labels:
        return "float64"
    return labels[0] if len(set(labels)) == 1 else ",".join(labels)


def _generic_region_of(name: str) -> Callable[..., Region]:
    def region_of(*inputs: Array) -> Region:
        shapes = tuple(tuple(int(d) for d in np.shape(x)) for x in inputs)
        return Region(name, shapes, inputs_label(inputs))

    return region_of


def _generic_exact(reference: Reference) -> Callable[..., np.ndarray]:
    def exact(*inputs: Array) -> np.ndarray:
        return to_host(reference(*inputs)).astype(np.float64)

    return exact


class OpRegistry:
    """Ops by name; the built-in ``matmul`` and ``softmax`` are always present.

    ``watch``: the first :meth:`get` after the candidate registry changed warns
    (:class:`UnknownOpWarning`) once per candidate registered for an op unknown here
    (the process's registry watches :data:`~pytest_arbiter.core.candidates.REGISTRY`).
    """

    def __init__(self, *, watch: bool = False) -> None:
        self._ops: dict[str, Op] = {}
        self._lock = threading.Lock()
        self._watch = watch
        self._seen_generation = -1
        self._warned: set[str] = set()
        for builtin in _builtin_ops():
            self._ops[builtin.name] = builtin

    def register(self, op: Op) -> Op:
        check_name("op", op.name)
        with self._lock:
            existing = self._ops.get(op.name)
            if existing is not None and existing.builtin:
                raise ValueError(f"op {op.name!r} is built in and cannot be redefined")
            if (existing is not None and existing.reference is not op.reference
                    and not _reimported(existing.reference, op.reference)):
                raise ValueError(
                    f"op {op.name!r} is already registered with reference "
                    f"{_origin(existing.reference)}; it cannot be re-registered with "
                    f"reference {_origin(op.reference)}")
            # the same reference, or a re-import of its defining module, replaces it
            self._ops[op.name] = op
        return op

    def get(self, name: str) -> Op:
        if self._watch and self._seen_generation != REGISTRY.generation:
            self._warn_unknown()
        try:
            return self._ops[name]
        except KeyError:
            known = ", ".join(sorted(self._ops))
            raise KeyError(f"unknown op {name!r}; registered ops: {known}") from None

    def unknown_op_lines(self) -> list[str]:
        """One line per registered candidate whose op is unknown here: its name, where it
        is defined, and the known op names closest to its op's."""
        known = set(self._ops)
        return [_unknown_line(c.name, c.op, definition_site(c), known)
                for c in REGISTRY.registered() if c.op not in known]

    def _warn_unknown(self) -> None:
        self._seen_generation = REGISTRY.generation
        known = set(self._ops)
        for cand in REGISTRY.registered():
            if cand.op not in known and cand.name not in self._warned:
                self._warned.add(cand.name)
                warnings.warn(UnknownOpWarning(_unknown_line(
                    cand.name, cand.op, definition_site(cand), known)), stacklevel=3)

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)

    def set_tf32(self, name: str, dtype: str, allow: bool) -> Op:
        """Replace op ``name`` with one whose budget does (or does not) accept kernels that
        round ``dtype`` inputs to TF32; see :func:`allow_tf32`."""
        if name not in _TF32_BUDGETS:
            raise ValueError(f"op {name!r} has no TF32 budget; a user op that accepts TF32 "
                             "passes its own budget=... to op()")
        if dtype_name(dtype) != "float32":
            raise ValueError(f"TF32 rounds float32 inputs, not {dtype}: float16 and bfloat16 "
                             "inputs already have at most TF32's precision")
        with self._lock:
            current = self.get(name)
            dtypes = current.allow_tf32 | {"float32"} if allow else frozenset()
            plain, tf32 = _TF32_BUDGETS[name]
            updated = replace(current, allow_tf32=frozenset(dtypes),
                              budget=tf32 if dtypes else plain)
            self._ops[name] = updated
        return updated


def _builtin_ops() -> list[Op]:
    return [
        Op("matmul", _matmul_reference, _validate_matmul, _matmul_region, _matmul_exact,
           _matmul_budget, _matmul_gate_inputs, builtin=True,
           doc="2-D matrix product: A (MxK) @ B (KxN)"),
        Op("softmax", _softmax_reference, _validate_softmax, _softmax_region, _softmax_exact,
           _softmax_budget, _softmax_gate_inputs, builtin=True,
           doc="softmax along the last axis"),
    ]


_TF32_BUDGETS: dict[str, tuple[BudgetFn, BudgetFn]] = {
    "matmul": (_matmul_budget, _matmul_budget_tf32)}

def _unknown_line(name: str, op_name: str, where: str, known: set[str]) -> str:
    close = difflib.get_close_matches(op_name, sorted(known), n=3, cutoff=0.6)
    hint = f"; closest known: {', '.join(close)}" if close else (
        f"; known ops: {', '.join(sorted(known))}")
    return (f"candidate {name!r} ({where}) is registered for op {op_name!r}, which no "
            f"op() registers and no built-in has: it is never used{hint}")


OPS = OpRegistry(watch=True)


def unknown_op_lines() -> list[str]:
    """The run summary's lines on candidates for unknown ops (see :class:`OpRegistry`)."""
    return OPS.unknown_op_lines()


def allow_tf32(op_name: str = "matmul", dtype: str = "float32", *, allow: bool = True) -> Op:
    """Accept kernels of ``op_name`` that round ``dtype`` inputs to TF32 (a GPU default for
    float32 GEMMs), in every gate of this process; ``allow=False`` takes it back.

    Off by default: the float32 budget fails such a kernel. A team that accepts TF32 says
    so once, before the first dispatch (a ``conftest.py``). The TF32 budget adds the input
    rounding, truncation included, to the float32 one (docs/accuracy.md, "TF32").
    """
    return OPS.set_tf32(op_name, dtype, allow)


def error_model(op: Op, inputs: Sequence[np.ndarray], exact: np.ndarray, *,
                generated: bool, out_dtype: str | None = None,
                reference_dtype: str | None = None) -> ErrorModel | None:
    """The :class:`ErrorModel` of a built-in op for ``inputs`` (host arrays) and their
    exact result; ``generated``: the gate drew the inputs itself (i.i.d. random values),
    so the sharper random-data bounds hold.

    A user op with the default budget whose reference returned ``reference_dtype``, more
    precise than the floating ``out_dtype`` its kernels return, gets the default budget
    with half an ulp for the output's rounding (:func:`_default_model`). ``None`` for any
    other user op: its ``budget`` is all there is.
    """
    if not op.builtin:
        if (op.budget is _default_budget and out_dtype is not None
                and reference_dtype is not None
                and precision(reference_dtype).unit_roundoff
                < precision(out_dtype).unit_roundoff):
            return _default_model(inputs, exact, out_dtype, reference_dtype)
        return None
    if op.name == "matmul":
        tf32 = dtype_name(inputs[0].dtype) in op.allow_tf32
        return _matmul_model(inputs, exact, generated=generated, tf32=tf32)
    if op.name == "softmax":
        return _softmax_model(inputs, exact, generated=generated)
    return None


def make_op(name: str, reference: Reference, *, validate: Callable[..., None] | None = None,
            budget: BudgetFn | None = None, out_dtype: Any = None,
            gate_inputs: UserGateInputs | None = None) -> Op:
    """Build a user op, gated on the dispatch's own inputs and on ``gate_inputs``' (else
    on trials derived from the dispatch's inputs)."""
    if not name or not isinstance(name, str):
        raise ValueError(f"op name must be a non-empty string, got {name!r}")
    for what, fn in (("reference", reference), ("validate", validate), ("budget", budget),
                     ("gate_inputs", gate_inputs)):
        if (fn is not None or what == "reference") and not callable(fn):
            raise TypeError(f"op {name!r}: {what} must be callable, got {type(fn).__name__}")
    resolved = None if out_dtype is None else _resolve_dtype(name, out_dtype)
    return Op(name, reference, validate or _generic_validate, _generic_region_of(name),
              _generic_exact(reference), budget or _default_budget, out_dtype=resolved,
              user_gate_inputs=gate_inputs)


def op(name: str, *, reference: Reference | None = None,
       validate: Callable[..., None] | None = None,
       budget: BudgetFn | None = None, out_dtype: Any = None,
       gate_inputs: UserGateInputs | None = None) -> Any:
    """Register a new op ``name`` whose reference is ``reference``.

    Call it (``op("axpy", reference=fn)``) or use it as a decorator on the reference
    (``@op("axpy")``). ``validate(*inputs)`` raises ``ValueError`` for inputs the op does
    not take, before any kernel runs (default: arrays of boolean, integer or floating
    dtype, and plain numbers). ``budget(inputs, exact)`` may give the allowed absolute
    error per output element; the default is documented in ``docs/accuracy.md`` (integer
    and boolean outputs: exact). ``gate_inputs(inputs, rng)`` returns a list of extra
    input tuples for the gate, made from one dispatch's inputs with the seeded
    ``numpy.random.Generator`` ``rng``; the gate adds trials it derives itself. The reference
    may compute in any precision: outputs are expected in :func:`result_dtype`, or in
    ``out_dtype`` (a dtype name or NumPy dtype) when given. Registering ``name`` again
    with another reference is ``ValueError``; a re-import of the same code is not.
    """
    if reference is not None:
        return OPS.register(make_op(name, reference, validate=validate, budget=budget,
                                    out_dtype=out_dtype, gate_inputs=gate_inputs))

    def decorate(fn: Reference) -> Reference:
        OPS.register(make_op(name, fn, validate=validate, budget=budget, out_dtype=out_dtype,
                             gate_inputs=gate_inputs))
        return fn

    return decorate

