"""The error model every op's budget is built from: the statistical checks' terms, the
elementwise allowance, and the rounding around an accumulated error bound
(docs/accuracy.md derives each op's terms)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from pytest_arbiter.core.dtypes import precision

BudgetFn = Callable[[Sequence[np.ndarray], np.ndarray], np.ndarray]

# Probabilistic rounding-error analysis (Higham & Mary, 2019): an inner product of
# length K has error at most lambda * sqrt(K) * u * sum|a_i b_i| with probability
# 1 - 2K exp(-lambda^2 / 2); lambda = 8 makes a false alarm practically impossible.
ERROR_LAMBDA = 8.0
TF32_UNIT_ROUNDOFF = 2.0 ** -11
"""TF32 keeps 10 of float32's 23 fraction bits: u = 2^-11 (round to nearest)."""


class ErrorScales(NamedTuple):
    """The statistical checks' terms at some outputs, in absolute units: ``sd`` bounds the
    scale (a standard deviation, or a sub-Gaussian scale) of the random part of the error
    that is independent from output to output; ``common`` that of a random part shared by
    a group of outputs (a softmax row's sum); ``systematic`` an error of one sign that a
    correct kernel may still make (a biased library ``exp``, TF32 truncation)."""

    sd: np.ndarray
    common: np.ndarray
    systematic: np.ndarray


@dataclass(frozen=True)
class ErrorModel:
    """How far a correct kernel's output may be from the exact result, per output element.

    ``allowed`` (the output's shape, float64, absolute) is the elementwise budget;
    ``scales(flat_indices)`` the statistical checks' terms at those outputs (computed
    only where the gate samples them); ``group_size`` > 0 says the flattened outputs come
    in consecutive groups of that many sharing the ``common`` error (a softmax row), 0
    that none do; ``flush`` the part of ``allowed`` that flush-to-zero may use up.
    docs/accuracy.md derives each op's terms.
    """

    allowed: np.ndarray
    scales: Callable[[np.ndarray], ErrorScales]
    group_size: int = 0
    flush: float = 0.0
    """What flushing float32 subnormals to zero may cost an output (absolute): the outputs
    it could move by a visible fraction of their spacing are left out of the checks."""


def finite_or_zero(values: np.ndarray) -> np.ndarray:
    finite = np.isfinite(values)
    return values if bool(finite.all()) else np.where(finite, values, 0.0)


_EXPONENT_BITS = np.uint64(0x7FF0000000000000)


def with_rounding(magnitude: np.ndarray, accumulated: np.ndarray, flush: float,
                   dtype: object) -> np.ndarray:
    """The elementwise budget around an accumulated error bound.

    A correct kernel's value before its last rounding lies within ``accumulated`` of the
    exact result (of absolute value ``magnitude``); rounding it to nearest adds at most
    half a spacing of the output's numbers at that value (:func:`~pytest_arbiter.core.dtypes.
    spacing`). ``flush``: what flushing float32 subnormals to zero (a GPU compile option)
    may cost. A float64 reference was computed in float64 itself: it carries the same
    accumulated error and a rounding of its own.
    """
    p = precision(dtype)
    rounding = p.unit_roundoff  # half a spacing is u 2^floor(log2 v)
    if p.name == "float64":
        accumulated, rounding = 2.0 * accumulated, 2.0 * rounding
    out = magnitude + accumulated
    np.maximum(out, p.smallest_normal, out=out)
    bits = out.view(np.uint64)
    bits &= _EXPONENT_BITS  # now 2^floor(log2 v): v's float64 bits, fraction cleared
    out *= rounding
    out += accumulated
    out += flush
    return out
