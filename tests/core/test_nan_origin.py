"""Where a reference's NaN comes from: carried from an input's NaN, or made of
infinities by its own arithmetic."""

from __future__ import annotations

import numpy as np

from pytest_arbiter.core.nan_origin import made_nans


def shifted_lse(x: np.ndarray) -> np.ndarray:
    """The max-shifted log-sum-exp: a row holding +inf gives inf - inf = NaN."""
    top = x.max(axis=-1, keepdims=True)
    out: np.ndarray = (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))[..., 0]
    return out


def test_without_a_nan_input_every_nan_is_made() -> None:
    x = np.zeros((3, 4))
    x[1, 2] = np.inf
    with np.errstate(all="ignore"):
        nan = np.isnan(shifted_lse(x))
    assert nan.tolist() == [False, True, False]
    assert made_nans(shifted_lse, [x], nan).tolist() == [False, True, False]


def test_a_nan_input_carries_its_nan_and_an_infinity_still_makes_one() -> None:
    """Row 0 holds a NaN (carried), row 2 a +inf (made); row 1 is plain."""
    x = np.zeros((3, 4), dtype=np.float32)
    x[0, 1] = np.nan
    x[2, 3] = np.inf
    with np.errstate(all="ignore"):
        nan = np.isnan(shifted_lse(x))
    assert nan.tolist() == [True, False, True]
    assert made_nans(shifted_lse, [x], nan).tolist() == [False, False, True]
    assert np.isnan(x[0, 1])  # the inputs are not changed


def test_a_nan_times_an_infinity_is_carried_not_made() -> None:
    """A matmul whose A holds a NaN where B's row holds an inf: NaN * inf is NaN, and it
    is the input's NaN (the stand-in 1 makes 1 * inf = inf, not NaN)."""
    a = np.ones((2, 2))
    a[0, 0] = np.nan
    b = np.ones((2, 2))
    b[0, :] = np.inf
    with np.errstate(all="ignore"):
        nan = np.isnan(a @ b)
    assert nan.tolist() == [[True, True], [False, False]]
    assert not made_nans(np.matmul, [a, b], nan).any()


def test_a_reference_of_another_shape_on_the_second_run_tells_nothing() -> None:
    x = np.array([np.nan, 1.0])
    seen: list[np.ndarray] = []

    def odd(v: np.ndarray) -> np.ndarray:
        seen.append(v.copy())
        return np.full(3, np.nan)

    assert not made_nans(odd, [x], np.array([True, False])).any()
    assert seen[0].tolist() == [1.0, 1.0]
