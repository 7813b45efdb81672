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
"""The stand-in for an infinity is the smallest largest-finite value of the floating
inputs' dtypes over this: large, with room for the reference's own sums."""

SHRINK = 256.0
"""The second run's stand-in is the first's over this: a limit that is infinite grows
with it."""


def limit_signs(reference: Callable[..., Any], inputs: Sequence[Any],
                nan: np.ndarray) -> np.ndarray:
    """Where the reference's NaN (``nan``: the mask of them in its result) was made of
    infinities and has an infinite limit, that limit's sign (+1 or -1); 0 elsewhere.

    The reference runs again on the inputs with every infinity replaced by a large
    finite value of its sign (:data:`HEADROOM`) and every NaN kept: once with one
    magnitude for every input, once with that over :data:`SHRINK`, and once more for each
    input holding an infinity with its own stand-in alone shrunk (two inputs' infinities
    need not be alike: ``x - 2 y`` has no limit at two infinities). Where a result is
    NaN, the NaN was carried (or is made of something else); where the results do not
    keep one sign, or the largest stand-in's result does not outgrow the all-shrunk one
    twice over, the limit is finite or undefined (``0 * inf``, a softmax of
    infinities). Only the rest has an infinite limit. A reference that raises, or
    returns another size, tells nothing: no limit anywhere.
    """
    nothing = np.zeros(nan.shape, dtype=np.int8)
    big = _stand_in(inputs)
    if big is None:
        return nothing  # no infinity to stand in for: no NaN was made of one
    holding = [i for i, x in enumerate(inputs) if _infinite(x)]
    plans = [dict.fromkeys(holding, big), dict.fromkeys(holding, big / SHRINK)]
    if len(holding) > 1:
        plans += [{**plans[0], i: big / SHRINK} for i in holding]
    try:
        with np.errstate(all="ignore"):
            found = [_run(reference, inputs, plan, nan.shape) for plan in plans]
    except Exception:
        return nothing
    runs = [r for r in found if r is not None]
    if len(runs) < len(plans):
        return nothing
    far, near = runs[0], runs[1]
    steady = far != 0
    for r in runs:
        steady &= ~np.isnan(r) & (np.sign(r) == np.sign(far))
    grows = steady & (np.abs(far) >= 2.0 * np.abs(near))
    signs: np.ndarray = np.where(nan & grows, np.sign(far), 0).astype(np.int8)
    return signs


def _infinite(x: Any) -> bool:
    values = np.asarray(x)
    return values.dtype.kind == "f" and bool(np.isinf(values).any())


def _stand_in(inputs: Sequence[Any]) -> float | None:
    """The stand-ins' magnitude, or None when no input holds an infinity."""
    found, largest = False, float(np.finfo(np.float64).max)
    for x in inputs:
        values = np.asarray(x)
        if values.dtype.kind != "f":
            continue
        largest = min(largest, float(np.finfo(values.dtype).max))
        found = found or bool(np.isinf(values).any())
    return largest / HEADROOM if found else None


def _run(reference: Callable[..., Any], inputs: Sequence[Any], plan: dict[int, float],
         shape: tuple[int, ...]) -> np.ndarray | None:
    """The reference on ``inputs`` with input ``i``'s infinities replaced by
    ``plan[i]`` of their sign, as float64 of ``shape`` (None: another size)."""
    stand_ins = []
    for i, x in enumerate(inputs):
        if i in plan:
            values = np.asarray(x)
            swapped = np.where(np.isinf(values), np.copysign(plan[i], values), values)
            x = swapped.astype(values.dtype) if isinstance(x, np.ndarray) else (
                values.dtype.type(swapped) if isinstance(x, np.generic) else float(swapped))
        stand_ins.append(x)
    again = np.asarray(reference(*stand_ins), dtype=np.float64).reshape(-1)
    return again.reshape(shape) if again.size == int(np.prod(shape)) else None
