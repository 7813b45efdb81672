"""The dtypes the arbiter knows, with the precision facts the F4 gate needs."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

DTYPE_NAMES = ("float64", "float32", "float16", "bfloat16")
_STANDARD: dict[str, np.dtype] = {
    "float64": np.dtype(np.float64),
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
}


@functools.lru_cache(maxsize=1)
def bfloat16() -> np.dtype:
    """NumPy has no bfloat16: ml_dtypes' (imported on first use; it is slow to import)."""
    import ml_dtypes

    return np.dtype(ml_dtypes.bfloat16)


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype for one of :data:`DTYPE_NAMES`."""
    if name == "bfloat16":
        return bfloat16()
    try:
        return _STANDARD[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; the arbiter supports "
                         f"{', '.join(DTYPE_NAMES)}") from None


@dataclass(frozen=True)
class Precision:
    """Unit roundoff of a dtype and of the precision it is expected to accumulate in.

    ``unit_roundoff`` u is half the spacing of the dtype's numbers in [1, 2) (2^-24 for
    float32), so round to nearest errs by at most ``u |x|`` for a normal ``x``;
    ``smallest_subnormal`` is the spacing below ``smallest_normal``.
    """

    name: str
    unit_roundoff: float
    accumulate_unit_roundoff: float
    smallest_normal: float
    largest: float
    smallest_subnormal: float = 0.0
    accumulate_smallest_normal: float = 0.0


def _finfo(dtype: np.dtype) -> tuple[float, float, float]:
    if dtype.name == "bfloat16":
        import ml_dtypes

        info = ml_dtypes.finfo(dtype)
    else:
        info = np.finfo(dtype)
    return float(info.eps) / 2.0, float(info.smallest_normal), float(info.max)


def dtype_name(dtype: object) -> str:
    """The arbiter's name for a dtype; ``ValueError`` for one it does not support."""
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return dtype
    resolved = np.dtype(dtype)  # type: ignore[call-overload]
    for name, known in _STANDARD.items():
        if resolved == known:
            return name
    # an array can only carry bfloat16 once ml_dtypes is imported, so this is cheap
    if resolved.name == "bfloat16" and resolved == bfloat16():
        return "bfloat16"
    raise ValueError(f"unsupported dtype {resolved}; the arbiter supports "
                     f"{', '.join(DTYPE_NAMES)}")


_PRECISIONS: dict[str, Precision] = {}


def precision(dtype: object) -> Precision:
    """Precision facts for ``dtype``: 16-bit types are expected to accumulate in float32."""
    name = dtype_name(dtype)
    cached = _PRECISIONS.get(name)
    if cached is not None:
        return cached
    u, tiny, largest = _finfo(numpy_dtype(name))
    accumulate = _STANDARD["float64" if name == "float64" else "float32"]
    u_acc, tiny_acc, _ = _finfo(accumulate)
    result = Precision(name, u, u_acc, tiny, largest, smallest_subnormal=tiny * 2.0 * u,
                       accumulate_smallest_normal=tiny_acc)
    _PRECISIONS[name] = result
    return result


_EXPONENT_BITS = np.uint64(0x7FF0000000000000)


def spacing(values: np.ndarray, dtype: object) -> np.ndarray:
    """The distance between neighbouring numbers of ``dtype`` at each of ``values``
    (float64): one ulp, ``2u 2^floor(log2|v|)`` for a normal ``v``, the subnormal spacing
    below the smallest normal. Round to nearest errs by at most half of it."""
    p = precision(dtype)
    magnitude = np.maximum(np.abs(np.asarray(values, dtype=np.float64)), p.smallest_normal)
    # 2^floor(log2 |v|): |v|'s float64 bits with the fraction cleared (|v| is normal)
    power = (magnitude.view(np.uint64) & _EXPONENT_BITS).view(np.float64)
    out: np.ndarray = power * (2.0 * p.unit_roundoff)
    return out


def round_to(values: np.ndarray, dtype: object) -> np.ndarray:
    """``values`` (float64) rounded to nearest (ties to even) in ``dtype``, back in float64:
    what a kernel that rounds the exact result once would return. To bfloat16 through
    float32 rounded to odd: ml_dtypes before 0.7 casts float64 to bfloat16 through
    float32 rounded to nearest, rounding twice (a value just above a tie lands on it and
    goes to even); a float32 rounded to odd keeps what the second rounding needs."""
    name = dtype_name(dtype)
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = _float32_rounded_to_odd(x) if name == "bfloat16" else x
        out: np.ndarray = narrow.astype(numpy_dtype(name)).astype(np.float64)
    return out


def _float32_rounded_to_odd(x: np.ndarray) -> np.ndarray:
    """``x`` in float32, truncated toward zero and its last bit set where inexact (round
    to odd): rounding that to any format at least two bits narrower rounds ``x`` once."""
    nearest = x.astype(np.float32)
    back = nearest.astype(np.float64)
    inexact = (back != x) & np.isfinite(x)
    if not inexact.any():
        return nearest
    bits = nearest.view(np.uint32).copy()
    away = inexact & (np.abs(back) > np.abs(x))  # rounded away from zero: step back
    bits[away] -= np.uint32(1)
    bits[inexact] |= np.uint32(1)
    out: np.ndarray = bits.view(np.float32)
    return out


def compute_dtype(dtype: object) -> np.dtype:
    """The dtype a CPU kernel computes in: float32 for the 16-bit types, else the dtype."""
    resolved = np.dtype(dtype)  # type: ignore[call-overload]
    if resolved.itemsize == 2:
        return np.dtype(np.float32)
    return resolved
