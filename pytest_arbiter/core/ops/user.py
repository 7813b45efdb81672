"""User ops (``pytest_arbiter.op(...)``): the default validation, key dtype, exact result
and budget of an op registered with a reference alone, and :func:`make_op`."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pytest_arbiter.core.dtypes import numpy_dtype, precision
from pytest_arbiter.core.ops.accuracy import (
    ERROR_LAMBDA,
    BudgetFn,
    ErrorModel,
    ErrorScales,
    finite_or_zero,
    with_rounding,
)
from pytest_arbiter.core.ops.arrays import (
    Array,
    Reference,
    dtype_of,
    first_float,
    is_float,
    to_host,
)
from pytest_arbiter.core.ops.definition import Op
from pytest_arbiter.core.regions import Region
from pytest_arbiter.core.user_inputs import UserGateInputs, is_scalar

_MIN_TERMS = 64
"""The default budget's shortest accumulation: ``8 sqrt(64) = 64`` units of ``u_acc``."""
_VARIED = 8
"""Fewer distinct values than this among 32 evenly spaced ones: an input that repeats."""


def _float_arrays(inputs: Sequence[Any]) -> list[Any]:
    return [x for x in inputs
            if not is_scalar(x) and hasattr(x, "dtype") and is_float(dtype_of(x))]


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


def default_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    first = first_float(inputs)
    p = precision(first if first is not None else np.float64)
    scale = float(np.max(np.abs(exact))) if exact.size else 0.0
    return 2.0 * p.unit_roundoff * np.abs(exact) + (
        _accumulation_units(inputs) * p.accumulate_unit_roundoff * scale + p.smallest_normal)


def default_model(inputs: Sequence[Any], exact: np.ndarray, out_dtype: str,
                   reference_dtype: str) -> ErrorModel:
    """The default budget of a user op whose reference computes in a wider precision than
    its output: the exact result rounded once to the output dtype (half an ulp), the
    reference's own rounding, and the accumulated error of :func:`_accumulation_units`,
    as for :func:`default_budget`; a float32 flush-to-zero is allowed as for the
    built-ins."""
    p = precision(out_dtype)
    magnitude = np.abs(finite_or_zero(exact))
    scale = float(np.max(magnitude)) if magnitude.size else 0.0
    accumulated = _accumulation_units(inputs) * p.accumulate_unit_roundoff * scale + (
        precision(reference_dtype).unit_roundoff * magnitude)
    flush = 2.0 * p.accumulate_smallest_normal
    allowed = with_rounding(magnitude, accumulated, flush, out_dtype)

    def scales(index: np.ndarray) -> ErrorScales:
        # the whole accumulated allowance is the random part's scale, not an eighth of
        # it: the default budget bounds errors of a shape it does not know (a scan's
        # outputs share theirs, a long sum of one sign leans a little)
        return ErrorScales(accumulated.reshape(-1)[index], np.zeros(index.shape),
                           np.zeros(index.shape))

    return ErrorModel(allowed, scales, flush=flush)


def compares_exactly(op: Op, out_dtype: np.dtype) -> bool:
    """Whether outputs of ``out_dtype`` must equal the reference's exactly: integer and
    boolean outputs under the default budget (a ``budget=`` of the op's own overrides)."""
    return op.budget is default_budget and out_dtype.kind in "biu"


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


def _resolve_dtype(name: str, dtype: Any) -> np.dtype:
    if isinstance(dtype, str) and dtype == "bfloat16":
        return numpy_dtype("bfloat16")
    try:
        return np.dtype(dtype)
    except TypeError:
        raise TypeError(f"op {name!r}: out_dtype must be a dtype name or a NumPy dtype, "
                        f"got {dtype!r}") from None


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
              _generic_exact(reference), budget or default_budget, out_dtype=resolved,
              user_gate_inputs=gate_inputs)
