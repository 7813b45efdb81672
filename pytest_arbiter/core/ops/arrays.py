"""What every op reads of its inputs: shapes, dtypes and the host copy, without touching
NumPy or CuPy beyond ``ndim``, ``shape`` and ``dtype`` until a value is needed; how an
input is described in a message, and how an output is packed (one array, a tuple)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

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


def input_text(x: Any) -> str:
    """One input for a message: an array's shape and, when it is not C-contiguous, its
    layout (``6x40``, ``6x40 F-order``, ``6x40 strided (reversed)``); a number by its
    value (``2.0``, ``int 3``, ``True``, ``float32 0.5``, a 0-d array's ``0-d float32
    0.5``), never an empty field."""
    if isinstance(x, bool | float):
        return repr(x)
    if isinstance(x, int):
        return f"int {x!r}"
    shape = getattr(x, "shape", None)
    if shape is None:
        return type(x).__name__
    if isinstance(x, np.generic):
        return f"{x.dtype.name} {x}"
    if len(shape) == 0:
        value = x[()] if isinstance(x, np.ndarray) else "array"
        return f"0-d {dtype_of(x).name} {value}"
    return "x".join(str(d) for d in shape) + _layout_text(x)


def _layout_text(x: Any) -> str:
    """`` F-order`` or `` strided (how)`` for an array that is not C-contiguous; ``""``
    for one that is (or that has no flags to tell)."""
    flags = getattr(x, "flags", None)
    if flags is None or flags.c_contiguous:
        return ""
    if flags.f_contiguous:
        return " F-order"
    how: dict[str, None] = {}
    try:
        step = int(x.itemsize)
        for stride, n in zip(reversed(x.strides), reversed(x.shape), strict=True):
            if n > 1 and stride != step:
                how["reversed" if stride < 0 else "broadcast" if stride == 0
                    else "overlapping" if stride < step else "with gaps"] = None
            step *= max(int(n), 1)
    except (AttributeError, TypeError, ValueError):
        return " strided"
    return f" strided ({', '.join(how)})" if how else " strided"


def inputs_text(inputs: Sequence[Any]) -> str:
    """The inputs for a message, each as :func:`input_text` gives it, comma-separated."""
    return ", ".join(input_text(x) for x in inputs)


OutputKind = Literal["array", "tuple", "list"]


class OutputForm(NamedTuple):
    """How an op's output is packed: one array (a NumPy scalar, a 0-d array and a plain
    number count as one: the contract tells them apart nowhere), or a tuple or a list of
    ``parts`` outputs. A candidate's must be the reference's (docs/contract.md)."""

    kind: OutputKind
    parts: int = 1

    def describe(self) -> str:
        if self.kind == "array":
            return "one array"
        return f"a {self.kind} of {self.parts} array{'' if self.parts == 1 else 's'}"


ONE_ARRAY = OutputForm("array")


def output_form(out: Any) -> OutputForm:
    """How ``out`` is packed (:class:`OutputForm`): a tuple (a named one too), a list, or
    one array."""
    if isinstance(out, tuple):
        return OutputForm("tuple", len(out))
    if isinstance(out, list):
        return OutputForm("list", len(out))
    return ONE_ARRAY


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
