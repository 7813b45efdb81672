"""Where a reference's NaN comes from, and whether an infinity there is its limit: only
a NaN made of infinities whose limit is infinite may come back as that infinity."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_arbiter.core.nan_origin import limit_signs


def shifted_lse(x: np.ndarray) -> np.ndarray:
    """The max-shifted log-sum-exp: a row holding +inf gives inf - inf = NaN."""
    w = np.asarray(x, dtype=np.float64)
    top = w.max(axis=-1, keepdims=True)
    out: np.ndarray = (top + np.log(np.exp(w - top).sum(axis=-1, keepdims=True)))[..., 0]
    return out


def softmax(x: np.ndarray) -> np.ndarray:
    w = np.asarray(x, dtype=np.float64)
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def standardise(x: np.ndarray) -> np.ndarray:
    w = np.asarray(x, dtype=np.float64)
    out: np.ndarray = (w - w.mean(axis=-1, keepdims=True)) / w.std(axis=-1, keepdims=True)
    return out


def nans(reference, *inputs):  # type: ignore[no-untyped-def]
    with np.errstate(all="ignore"):
        return np.isnan(reference(*inputs))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_a_row_holding_inf_has_an_infinite_limit(dtype: str) -> None:
    """scipy's +inf for the row holding +inf is the limit; the plain rows have no NaN."""
    x = np.zeros((3, 4), dtype=dtype)
    x[1, 2] = np.inf
    nan = nans(shifted_lse, x)
    assert nan.tolist() == [False, True, False]
    assert limit_signs(shifted_lse, [x], nan).tolist() == [0, 1, 0]


def test_a_nan_input_is_carried_even_beside_an_inf() -> None:
    """Row 0 holds a NaN and a +inf: carried, whatever the inf would make; row 2 only a
    +inf: made, with a +inf limit."""
    x = np.zeros((3, 4), dtype=np.float32)
    x[0, 1], x[0, 2] = np.nan, np.inf
    x[2, 3] = np.inf
    nan = nans(shifted_lse, x)
    assert nan.tolist() == [True, False, True]
    assert limit_signs(shifted_lse, [x], nan).tolist() == [0, 0, 1]
    assert np.isinf(x[2, 3]) and np.isnan(x[0, 1])  # the inputs are not changed


def test_a_finite_limit_is_no_licence_for_an_infinity() -> None:
    """A softmax of a fully masked row (all -inf) and of a row holding +inf, a matmul's
    0 * inf and inf - inf: made of infinities, but their limits are finite."""
    rows = np.zeros((2, 4))
    rows[0, :] = -np.inf
    rows[1, 0] = np.inf
    assert limit_signs(softmax, [rows], nans(softmax, rows)).tolist() == [[0] * 4] * 2
    a = np.array([[0.0, 0.0], [1.0, 1.0]])
    b = np.array([[np.inf, 1.0], [-np.inf, 1.0]])
    nan = nans(np.matmul, a, b)
    assert nan.tolist() == [[True, False], [True, False]]
    assert not limit_signs(np.matmul, [a, b], nan).any()


def test_a_nan_the_data_holds_is_never_made() -> None:
    """A NaN beside equal values (a standardised row: 0/0 once the NaN is gone) stays a
    NaN the data holds; so does one in an input that is not an array."""
    x = np.array([[np.nan, 1.0, 1.0, np.inf]])
    assert not limit_signs(standardise, [x], nans(standardise, x)).any()
    assert not limit_signs(lambda v, s: shifted_lse(v) * s, [x, float("nan")],
                           np.array([True])).any()


def test_a_reference_that_raises_or_changes_shape_tells_nothing() -> None:
    x = np.array([[1.0, np.inf]])

    def raises(v: np.ndarray) -> np.ndarray:
        if np.isfinite(v).all():
            raise ValueError("finite inputs refused")
        return shifted_lse(v)

    nan = nans(shifted_lse, x)
    assert limit_signs(shifted_lse, [x], nan).tolist() == [1]
    assert not limit_signs(raises, [x], nan).any()
    assert not limit_signs(lambda v: np.full(3, 1e300), [x], nan).any()


def test_infinities_of_other_sizes_have_no_limit() -> None:
    """A scalar infinity beside an array's, two dtypes' infinities, ``x - 2 y``: the
    limit depends on how the infinities compare, so there is none to accept."""
    x = np.array([np.inf, 1.0], dtype=np.float32)
    minus = nans(np.subtract, x, np.float32(np.inf))
    assert not limit_signs(np.subtract, [x, np.float32(np.inf)], minus).any()
    assert not limit_signs(np.subtract, [x, float("inf")], minus).any()
    y = np.array([np.inf, 1.0])
    assert not limit_signs(np.subtract, [x, y], nans(np.subtract, x, y)).any()

    def x_minus_2y(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out: np.ndarray = a - 2 * b
        return out

    assert not limit_signs(x_minus_2y, [y, y], nans(x_minus_2y, y, y)).any()


def test_a_bounded_result_has_no_infinite_limit_in_any_dtype() -> None:
    """1000 times a softmax: a row holding +inf tends to 1000, in float16 as in float32."""
    def scaled(v: np.ndarray) -> np.ndarray:
        out: np.ndarray = 1000.0 * softmax(v)
        return out

    for dtype in ("float16", "float32"):
        x = np.zeros((2, 4), dtype=dtype)
        x[0, 1] = np.inf
        nan = nans(scaled, x)
        assert nan[0].all() and not nan[1].any()
        assert not limit_signs(scaled, [x], nan).any()
