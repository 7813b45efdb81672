"""The dtypes the arbiter knows, with the precision facts the F4 gate needs."""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)

SUPPORTED_DTYPES: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": bfloat16,
}


@dataclass(frozen=True)
class Precision:
    """Unit roundoff of a dtype and of the precision it is expected to accumulate in."""

    name: str
    unit_roundoff: float
    accumulate_unit_roundoff: float
    smallest_normal: float
    largest: float


def _finfo(dtype: np.dtype) -> tuple[float, float, float]:
    info = ml_dtypes.finfo(dtype) if dtype == bfloat16 else np.finfo(dtype)
    return float(info.eps) / 2.0, float(info.smallest_normal), float(info.max)


def dtype_name(dtype: object) -> str:
    """The arbiter's name for a dtype; ``ValueError`` for one it does not support."""
    resolved = np.dtype(dtype)  # type: ignore[call-overload]
    for name, known in SUPPORTED_DTYPES.items():
        if resolved == known:
            return name
    supported = ", ".join(SUPPORTED_DTYPES)
    raise ValueError(f"unsupported dtype {resolved}; the arbiter supports {supported}")


_PRECISIONS: dict[str, Precision] = {}


def precision(dtype: object) -> Precision:
    """Precision facts for ``dtype``: 16-bit types are expected to accumulate in float32."""
    name = dtype_name(dtype)
    cached = _PRECISIONS.get(name)
    if cached is not None:
        return cached
    u, tiny, largest = _finfo(SUPPORTED_DTYPES[name])
    accumulate = SUPPORTED_DTYPES["float64" if name == "float64" else "float32"]
    u_acc, _, _ = _finfo(accumulate)
    result = Precision(name, u, u_acc, tiny, largest)
    _PRECISIONS[name] = result
    return result


def compute_dtype(dtype: object) -> np.dtype:
    """The dtype a CPU kernel computes in: float32 for the 16-bit types, else the dtype."""
    resolved = np.dtype(dtype)  # type: ignore[call-overload]
    if resolved.itemsize == 2:
        return np.dtype(np.float32)
    return resolved
