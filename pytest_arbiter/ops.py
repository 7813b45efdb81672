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


@dataclass(frozen=True)
class Op:
    """A kind of work with one reference semantics.

    ``reference`` returns the result in the inputs' dtype (it is what runs when a
    candidate declines); ``exact`` returns the float64 ground truth the gate uses.
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
            budget: BudgetFn | None = None) -> Op:
    """Build a user op whose gate runs on the dispatch's own inputs."""
    if not name or not isinstance(name, str):
        raise ValueError(f"op name must be a non-empty string, got {name!r}")
    if not callable(reference):
        raise TypeError(f"op {name!r}: reference must be callable, got {type(reference).__name__}")
    return Op(name, reference, validate or _generic_validate, _generic_region_of(name),
              _generic_exact(reference), budget or _default_budget)


def op(name: str, *, reference: Reference | None = None,
       validate: Callable[..., None] | None = None,
       budget: BudgetFn | None = None) -> Any:
    """Register a new op ``name`` whose reference is ``reference``.

    Call it (``op("axpy", reference=fn)``) or use it as a decorator on the reference
    (``@op("axpy")``). ``budget(inputs, exact)`` may give the allowed absolute error
    per output element; the default is documented in ``docs/accuracy.md``.
    """
    if reference is not None:
        return OPS.register(make_op(name, reference, validate=validate, budget=budget))

    def decorate(fn: Reference) -> Reference:
        OPS.register(make_op(name, fn, validate=validate, budget=budget))
        return fn

    return decorate

