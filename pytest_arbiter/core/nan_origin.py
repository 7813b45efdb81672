"""Where a reference's NaN comes from: carried from a NaN input, or made by the
reference's own arithmetic of infinities (``inf - inf``, ``0 * inf``, ``inf / inf``), and
then whether the infinity another implementation gives there is the limit.

A NaN an input carries must come back NaN: a kernel that drops it hides bad data. A NaN
the reference makes of infinities is one resolution of an indeterminate form, and
another implementation may give the infinity its limit has: the log-sum-exp of a row
holding ``+inf`` is ``+inf`` in ``scipy.special.logsumexp`` and NaN in a reference that
shifts by the row's maximum, as a compensated sum may turn the reference's infinity into
NaN. The F4 gate holds a candidate to the first and accepts the limit for the second
(:func:`pytest_arbiter.core.gate`'s non-finite checks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

HEADROOM = 16.0
"""An input's infinity stands in as its dtype's largest finite value over this: large,
with room left for the reference's own sums before they overflow."""


def limit_signs(reference: Callable[..., Any], inputs: Sequence[Any],
                nan: np.ndarray) -> np.ndarray:
    """Where the reference's NaN (``nan``: the mask of them in its result) was made of
    infinities and has an infinite limit, that limit's sign (+1 or -1); 0 elsewhere.

    The reference runs again on the inputs with every infinity replaced by a large finite
    value of its sign (:data:`HEADROOM`) and every NaN kept: where that result is NaN, the
    NaN was carried (or is made of something else); where it is finite and not huge (at
    most the square root of the stand-in's magnitude), the limit is finite (``0 * inf``,
    a softmax of infinities). Only the rest has an infinite limit. Inputs that are not
    floating NumPy arrays are passed as they are; a reference that raises, or returns
    another shape, tells nothing: no limit anywhere.
    """
    nothing = np.zeros(nan.shape, dtype=np.int8)
    stand_ins: list[Any] = []
    scale = np.inf
    for x in inputs:
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            big = float(np.finfo(x.dtype).max) / HEADROOM
            infinite = np.isinf(x)
            if infinite.any():
                scale = min(scale, big)
                x = np.where(infinite, np.copysign(big, x), x).astype(x.dtype)
        stand_ins.append(x)
    if scale == np.inf:
        return nothing  # no infinity to stand in for: no NaN was made of one
    try:
        with np.errstate(all="ignore"):
            again = np.asarray(reference(*stand_ins), dtype=np.float64)
    except Exception:
        return nothing
    if again.shape != nan.shape:
        return nothing
    huge = nan & ~np.isnan(again) & (np.abs(again) > np.sqrt(scale))
    signs: np.ndarray = np.where(huge, np.sign(again), 0).astype(np.int8)
    return signs
