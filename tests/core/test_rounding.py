"""Rounding an exact float64 result to a narrow dtype is one rounding, whatever the
installed ml_dtypes does (before 0.7 it casts float64 to bfloat16 through float32,
rounding twice)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_arbiter.core.dtypes import round_to


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_value_just_above_a_bfloat16_tie_rounds_away_from_it(sign: float) -> None:
    tie = 1.0 + 2.0 ** -8  # halfway between 1 and 1 + 2^-7
    values = sign * np.array([tie * (1.0 + 2.0 ** -40), tie, tie * (1.0 - 2.0 ** -40)])
    assert (round_to(values, "bfloat16") * sign).tolist() == [1.0 + 2.0 ** -7, 1.0, 1.0]


def test_bfloat16_rounding_at_the_ends_of_its_range() -> None:
    largest = (2.0 - 2.0 ** -7) * 2.0 ** 127
    half_ulp = 2.0 ** 119
    tiny = 2.0 ** -133  # bfloat16's smallest subnormal
    values = np.array([largest, largest + half_ulp * 0.99, largest + half_ulp * 1.01,
                       1e39, tiny, tiny * 0.51, tiny * 0.49, tiny * 1.5, 0.0, -0.0,
                       np.inf, -np.inf, np.nan])
    out = round_to(values, "bfloat16")
    assert out[:9].tolist() == [largest, largest, np.inf, np.inf, tiny, tiny, 0.0,
                                2 * tiny, 0.0]
    assert np.signbit(out[9]) and out[10] == np.inf and out[11] == -np.inf
    assert np.isnan(out[12])
