"""Input checks of the GPU wrappers, run before CuPy is imported or anything is allocated.

They read only ``ndim``, ``shape``, ``dtype``, ``flags`` and, for device arrays, the data
pointer, so they work on NumPy and CuPy arrays alike, and a bad input is refused before
any side effect.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pytest_arbiter.core.dtypes import dtype_name


def _shape(x: Any) -> str:
    return "x".join(str(d) for d in x.shape)


def _is_array(x: Any) -> bool:
    return all(hasattr(x, attr) for attr in ("shape", "dtype", "ndim"))


def _dtype(x: Any) -> str | None:
    try:
        return dtype_name(x.dtype)
    except (TypeError, ValueError):
        return None


def is_c_contiguous(x: Any) -> bool:
    flags = getattr(x, "flags", None)
    return bool(getattr(flags, "c_contiguous", False))


def device_pointer(x: Any) -> int | None:
    """The data pointer of a CuPy array, ``None`` for host arrays (they are copied)."""
    if type(x).__module__.partition(".")[0] != "cupy":
        return None
    return int(x.data.ptr)


def matmul_problem(a: Any, b: Any, dtypes: Collection[str]) -> str | None:
    """Why ``a @ b`` is invalid or unsupported here, or ``None`` when it is fine."""
    if not _is_array(a) or not _is_array(b):
        return (f"matmul needs two arrays, got {type(a).__name__} and {type(b).__name__}")
    if a.ndim != 2 or b.ndim != 2:
        return f"matmul needs 2-D A (MxK) and B (KxN): A is {_shape(a)}, B is {_shape(b)}"
    if a.shape[1] != b.shape[0]:
        return (f"matmul contraction mismatch: A is {_shape(a)} (K={a.shape[1]}) but "
                f"B is {_shape(b)} (K={b.shape[0]})")
    if a.dtype != b.dtype:
        return f"matmul dtypes differ: A is {_shape(a)} {a.dtype}, B is {_shape(b)} {b.dtype}"
    name = _dtype(a)
    if name not in dtypes:
        return f"dtype {a.dtype} is not supported (supported: {', '.join(sorted(dtypes))})"
    if not is_c_contiguous(a) or not is_c_contiguous(b):
        return (f"inputs must be C-contiguous: A ({_shape(a)}) {is_c_contiguous(a)}, "
                f"B ({_shape(b)}) {is_c_contiguous(b)}")
    return None


def softmax_problem(x: Any, dtypes: Collection[str]) -> str | None:
    """Why softmax over the last axis of ``x`` is invalid or unsupported here, or ``None``."""
    if not _is_array(x):
        return f"softmax needs an array, got {type(x).__name__}"
    if x.ndim < 1 or x.shape[-1] == 0:
        return f"softmax needs an array with a non-empty last axis, got {_shape(x)}"
    name = _dtype(x)
    if name not in dtypes:
        return f"dtype {x.dtype} is not supported (supported: {', '.join(sorted(dtypes))})"
    if not is_c_contiguous(x):
        return f"input ({_shape(x)}) must be C-contiguous"
    return None


def input_count_problem(inputs: tuple[Any, ...], expected: int, op: str) -> str | None:
    if len(inputs) != expected:
        return f"{op} takes {expected} array(s), got {len(inputs)}"
    return None


def matmul_inputs_problem(inputs: tuple[Any, ...], dtypes: Collection[str]) -> str | None:
    """Why ``inputs`` are not a valid ``(A, B)`` for a GPU matmul here, or ``None``."""
    return input_count_problem(inputs, 2, "matmul") or matmul_problem(
        inputs[0], inputs[1], dtypes)


def softmax_inputs_problem(inputs: tuple[Any, ...], dtypes: Collection[str]) -> str | None:
    """Why ``inputs`` are not a valid ``(x,)`` for a GPU softmax here, or ``None``."""
    return input_count_problem(inputs, 1, "softmax") or softmax_problem(inputs[0], dtypes)
