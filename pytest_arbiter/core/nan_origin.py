"""Where a reference's NaN comes from: carried from a NaN input, or made by the
reference's own arithmetic (``inf - inf``, ``0 * inf``, ``inf / inf``).

A NaN an input carries must come back NaN: a kernel that drops it hides bad data. A NaN
the reference makes of infinities is one resolution of an indeterminate form, and
another implementation may give the infinity its limit has: the log-sum-exp of a row
holding ``+inf`` is ``+inf`` in ``scipy.special.logsumexp`` and NaN in a reference that
shifts by the row's maximum, as a compensated sum may turn the reference's infinity into
NaN. The F4 gate holds a candidate to the first and accepts either for the second
(:func:`pytest_arbiter.core.gate`'s non-finite checks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

STAND_IN = 1.0
"""What replaces an input's NaN to tell the two apart: finite and not zero, so it makes
no NaN of its own (``0 * inf`` would)."""


def made_nans(reference: Callable[..., Any], inputs: Sequence[Any],
              nan: np.ndarray) -> np.ndarray:
    """Of the reference's NaNs (``nan``: the mask of them in its result), those it made:
    all of them when no input holds a NaN; else those still NaN when the reference runs
    again on the inputs with every NaN replaced by :data:`STAND_IN`. A result of another
    shape tells nothing: none is taken as made."""
    cleaned: list[Any] = []
    carried = False
    for x in inputs:
        if isinstance(x, np.ndarray) and x.dtype.kind in "fc":
            holes = np.isnan(x)
            if holes.any():
                carried = True
                x = np.where(holes, np.asarray(STAND_IN, dtype=x.dtype), x)
        cleaned.append(x)
    if not carried:
        return nan
    with np.errstate(all="ignore"):
        again = np.asarray(reference(*cleaned))
    if again.shape != nan.shape or again.dtype.kind not in "fc":
        return np.zeros_like(nan)
    made: np.ndarray = nan & np.isnan(again)
    return made
