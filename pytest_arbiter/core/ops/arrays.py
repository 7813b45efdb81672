"""What every op reads of its inputs: shapes, dtypes and the host copy, without touching
NumPy or CuPy beyond ``ndim``, ``shape`` and ``dtype`` until a value is needed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pytest_arbiter.core.dtypes import DTYPE_NAMES, dtype_name, numpy_dtype
from pytest_arbiter.core.user_inputs import is_scalar

Array = Any
Reference = Callable[..., Array]


def shape_of(x: Array) -> str:
    """An array's shape for a message: ``4x0x16``, ``a 0-d array``, or the type's name."""
    shape = getattr(x, "shape", None)
    if shape is None:
        return type(x).__name__
    return "x".join(str(d) for d in shape) if len(shape) else "a 0-d array"


def require_array(x: Array, what: str) -> None:
    if not all(hasattr(x, attr) for attr in ("shape", "dtype", "ndim")):
        raise ValueError(f"{what} must be an array with shape and dtype, got {type(x).__name__}")


def to_host(x: Array) -> np.ndarray:
    """A NumPy view or copy of ``x`` (CuPy arrays are copied from the device); several
    outputs (a tuple) copied each, then stacked."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, tuple):
        return np.asarray(tuple(to_host(part) for part in x))
    getter = getattr(x, "get", None)
    if callable(getter):
        return np.asarray(getter())
    return np.asarray(x)


def like(result: np.ndarray, template: Array) -> Array:
    """Return ``result`` on the same kind of device as ``template``."""
    if isinstance(template, np.ndarray):
        return result
    module = type(template).__module__.split(".")[0]
    if module == "cupy":
        import cupy

        return cupy.asarray(result)
    return result


def is_float(dtype: np.dtype) -> bool:
    """NumPy's floating dtypes and ml_dtypes' bfloat16 (without importing ml_dtypes)."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def dtype_of(x: Any) -> np.dtype:
    found = getattr(x, "dtype", None)
    if found is not None:
        return np.dtype(found)
    return np.asarray(x).dtype


def same_device_kind(x: Any, template: Any) -> bool:
    return type(x).__module__.split(".")[0] == type(template).__module__.split(".")[0]


def first_float(inputs: Sequence[Any]) -> np.dtype | None:
    """The dtype of the first floating-point array among ``inputs`` (numbers skipped)."""
    for x in inputs:
        found = getattr(x, "dtype", None)
        if found is not None and hasattr(x, "shape") and not is_scalar(x):
            dtype = np.dtype(found)
            if is_float(dtype):
                return dtype
    return None


def builtin_dtype(op_name: str, x: Array) -> str:
    """The dtype name of a built-in op's input; a clear ``ValueError`` for another."""
    try:
        return dtype_name(x.dtype)
    except (TypeError, ValueError):
        raise ValueError(
            f"{op_name} supports {', '.join(DTYPE_NAMES)} inputs, got {x.dtype} (a user op, "
            f"pytest_arbiter.op(...), takes any dtype its reference does)") from None


def cast(values: np.ndarray, dtype: str) -> np.ndarray:
    return values.astype(numpy_dtype(dtype), copy=False)
