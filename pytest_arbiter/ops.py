"""The op registry: each op's reference, input validation, regions, gate inputs and budget.

Validation runs before any candidate or reference touches the inputs (SPEC bug 2):
it reads only ``ndim``, ``shape`` and ``dtype``, so it works on NumPy and CuPy arrays
alike and allocates nothing.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_arbiter.dtypes import dtype_name, numpy_dtype, precision
from pytest_arbiter.regions import MatmulRegion, Region, SoftmaxRegion

Array = Any
Reference = Callable[..., Array]
BudgetFn = Callable[[Sequence[np.ndarray], np.ndarray], np.ndarray]

# Probabilistic rounding-error analysis (Higham & Mary, 2019): an inner product of
# length K has error at most lambda * sqrt(K) * u * sum|a_i b_i| with probability
# 1 - 2K exp(-lambda^2 / 2); lambda = 8 makes a false alarm practically impossible.
ERROR_LAMBDA = 8.0


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

    The op's declared ``out_dtype`` if any; else, when the reference output and the first
    input are both floating point (bfloat16 included), the first input's dtype (a float64
    reference of float32 inputs expects float32); else the reference output's own dtype
    (an argmax returning int64 stays int64). Built-in ops: the first input's dtype.
    """
    if op.out_dtype is not None:
        return op.out_dtype
    if op.builtin and inputs:
        return _dtype_of(inputs[0])
    ref = _dtype_of(reference_out)
    if inputs and _is_float(ref):
        first = getattr(inputs[0], "dtype", None)
        if first is not None and _is_float(np.dtype(first)):
            return np.dtype(first)
    return ref


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
    dtype_name(a.dtype)


def _matmul_region(a: Array, b: Array) -> MatmulRegion:
    return MatmulRegion.of(int(a.shape[0]), int(b.shape[1]), int(a.shape[1]),
                           dtype_name(a.dtype))


def _matmul_exact(a: Array, b: Array) -> np.ndarray:
    return np.matmul(to_host(a).astype(np.float64), to_host(b).astype(np.float64))


def _matmul_reference(a: Array, b: Array) -> Array:
    return _like(_matmul_exact(a, b).astype(a.dtype), a)


def _matmul_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    a, b = (np.asarray(x, dtype=np.float64) for x in inputs)
    p = precision(inputs[0].dtype)
    k = a.shape[1]
    gamma = min(float(k), ERROR_LAMBDA * math.sqrt(k)) * p.accumulate_unit_roundoff
    magnitude = np.matmul(np.abs(a), np.abs(b))
    return 2.0 * p.unit_roundoff * np.abs(exact) + gamma * magnitude + p.smallest_normal


def _cast(values: np.ndarray, dtype: str) -> np.ndarray:
    return values.astype(numpy_dtype(dtype))


def _ragged(d: int) -> int:
    return d + 1 if d % 2 == 0 else d


def _matmul_gate_inputs(region: Region, seed: int) -> list[tuple[np.ndarray, ...]]:
    assert isinstance(region, MatmulRegion)
    m, n, k, dtype = region.m, region.n, region.k, region.dtype
    scale_exp = 3 if numpy_dtype(dtype).itemsize == 2 else 8
    trials: list[tuple[np.ndarray, ...]] = []
    for trial in range(4):
        rng = np.random.default_rng(seed + trial)
        if trial == 2:
            tm, tn, tk = _ragged(m), _ragged(n), _ragged(k)
        else:
            tm, tn, tk = m, n, k
        if trial == 1:
            # all-positive sums grow steadily, so a low-precision accumulator stagnates
            a = rng.uniform(0.0, 1.0, (tm, tk))
            b = rng.uniform(0.0, 1.0, (tk, tn))
        elif trial == 3:
            a = rng.standard_normal((tm, tk)) * np.exp2(
                rng.integers(-scale_exp, scale_exp + 1, (tm, 1)))
            b = rng.standard_normal((tk, tn)) * np.exp2(
                rng.integers(-scale_exp, scale_exp + 1, (1, tn)))
        else:
            a = rng.standard_normal((tm, tk))
            b = rng.standard_normal((tk, tn))
        trials.append((_cast(a, dtype), _cast(b, dtype)))
    return trials


def _validate_softmax(*inputs: Array) -> None:
    if len(inputs) != 1:
        raise ValueError(f"softmax takes one array, got {len(inputs)}")
    (x,) = inputs
    _require_array(x, "softmax input")
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"softmax needs an array with a non-empty last axis, got {_shape_of(x)}")
    dtype_name(x.dtype)


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


def _softmax_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    x = np.asarray(inputs[0], dtype=np.float64)
    p = precision(inputs[0].dtype)
    n = x.shape[-1]
    # exp(x - max) carries a relative error of |x - max| * u from the subtraction,
    # the sum one of lambda * sqrt(n) * u, the division and exp a few u more
    distance = x.max(axis=-1, keepdims=True) - x
    relative = 2.0 * p.unit_roundoff + (
        8.0 + ERROR_LAMBDA * math.sqrt(n) + distance) * p.accumulate_unit_roundoff
    return relative * np.abs(exact) + p.smallest_normal


def _softmax_gate_inputs(region: Region, seed: int) -> list[tuple[np.ndarray, ...]]:
    assert isinstance(region, SoftmaxRegion)
    shape, dtype = region.shape, region.dtype
    offset = 3000.0 if numpy_dtype(dtype).itemsize == 2 else 1000.0
    ragged = (*shape[:-1], _ragged(shape[-1])) if len(shape) == 1 else (
        _ragged(shape[0]), *shape[1:-1], _ragged(shape[-1]))
    trials: list[tuple[np.ndarray, ...]] = []
    for trial in range(4):
        rng = np.random.default_rng(seed + trial)
        if trial == 0:
            x = rng.standard_normal(shape) * 3.0
        elif trial == 1:
            # a large common offset overflows exp() in any kernel that skips the max
            x = rng.standard_normal(shape) * 3.0 + offset
        elif trial == 2:
            x = rng.standard_normal(ragged) * 3.0
        else:
            x = rng.standard_normal(shape) * 20.0
        trials.append((_cast(x, dtype),))
    return trials


def _default_budget(inputs: Sequence[np.ndarray], exact: np.ndarray) -> np.ndarray:
    p = precision(inputs[0].dtype) if inputs else precision(np.float64)
    scale = float(np.max(np.abs(exact))) if exact.size else 0.0
    return 2.0 * p.unit_roundoff * np.abs(exact) + (
        64.0 * p.accumulate_unit_roundoff * scale + p.smallest_normal)


def _generic_validate(*inputs: Array) -> None:
    for i, x in enumerate(inputs):
        _require_array(x, f"input {i}")
    if inputs:
        dtype_name(inputs[0].dtype)


def _generic_region_of(name: str) -> Callable[..., Region]:
    def region_of(*inputs: Array) -> Region:
        shapes = tuple(tuple(int(d) for d in x.shape) for x in inputs)
        dtype = dtype_name(inputs[0].dtype) if inputs else "float64"
        return Region(name, shapes, dtype)

    return region_of


def _generic_exact(reference: Reference) -> Callable[..., np.ndarray]:
    def exact(*inputs: Array) -> np.ndarray:
        return to_host(reference(*inputs)).astype(np.float64)

    return exact


class OpRegistry:
    """Ops by name; the built-in ``matmul`` and ``softmax`` are always present."""

    def __init__(self) -> None:
        self._ops: dict[str, Op] = {}
        self._lock = threading.Lock()
        for builtin in _builtin_ops():
            self._ops[builtin.name] = builtin

    def register(self, op: Op) -> Op:
        with self._lock:
            existing = self._ops.get(op.name)
            if existing is not None and existing.builtin:
                raise ValueError(f"op {op.name!r} is built in and cannot be redefined")
            if (existing is not None and existing.reference is not op.reference
                    and _origin(existing.reference) != _origin(op.reference)):
                raise ValueError(
                    f"op {op.name!r} is already registered with reference "
                    f"{_origin(existing.reference)}; it cannot be re-registered with "
                    f"reference {_origin(op.reference)}")
            # the same reference, or a re-import of its defining module, replaces it
            self._ops[op.name] = op
        return op

    def get(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            known = ", ".join(sorted(self._ops))
            raise KeyError(f"unknown op {name!r}; registered ops: {known}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)


def _builtin_ops() -> list[Op]:
    return [
        Op("matmul", _matmul_reference, _validate_matmul, _matmul_region, _matmul_exact,
           _matmul_budget, _matmul_gate_inputs, builtin=True,
           doc="2-D matrix product: A (MxK) @ B (KxN)"),
        Op("softmax", _softmax_reference, _validate_softmax, _softmax_region, _softmax_exact,
           _softmax_budget, _softmax_gate_inputs, builtin=True,
           doc="softmax along the last axis"),
    ]


OPS = OpRegistry()


def make_op(name: str, reference: Reference, *, validate: Callable[..., None] | None = None,
            budget: BudgetFn | None = None, out_dtype: Any = None) -> Op:
    """Build a user op whose gate runs on the dispatch's own inputs."""
    if not name or not isinstance(name, str):
        raise ValueError(f"op name must be a non-empty string, got {name!r}")
    if not callable(reference):
        raise TypeError(f"op {name!r}: reference must be callable, got {type(reference).__name__}")
    resolved = None if out_dtype is None else _resolve_dtype(name, out_dtype)
    return Op(name, reference, validate or _generic_validate, _generic_region_of(name),
              _generic_exact(reference), budget or _default_budget, out_dtype=resolved)


def op(name: str, *, reference: Reference | None = None,
       validate: Callable[..., None] | None = None,
       budget: BudgetFn | None = None, out_dtype: Any = None) -> Any:
    """Register a new op ``name`` whose reference is ``reference``.

    Call it (``op("axpy", reference=fn)``) or use it as a decorator on the reference
    (``@op("axpy")``). ``budget(inputs, exact)`` may give the allowed absolute error
    per output element; the default is documented in ``docs/accuracy.md``. The reference
    may compute in any precision: outputs are expected in :func:`result_dtype`, or in
    ``out_dtype`` (a dtype name or NumPy dtype) when given. Registering ``name`` again
    with another reference is ``ValueError``; a re-import of the same code is not.
    """
    if reference is not None:
        return OPS.register(make_op(name, reference, validate=validate, budget=budget,
                                    out_dtype=out_dtype))

    def decorate(fn: Reference) -> Reference:
        OPS.register(make_op(name, fn, validate=validate, budget=budget, out_dtype=out_dtype))
        return fn

    return decorate

