"""Real third-party kernels through the F4 gate, as a new user's project has them
(pytester): the gate holds them to the reference's NaNs where an input carried one, and
accepts the infinity a library gives where the reference made NaN of infinities."""

from __future__ import annotations

import pytest

pytest.importorskip("scipy")

LIB = '''
import numpy as np
import pytest_arbiter
from scipy.special import logsumexp


def lse_ref(x):
    """Shifted by each row's maximum: a row holding +inf gives inf - inf = NaN."""
    w = x.astype(np.float64)
    m = w.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(w - m).sum(axis=-1, keepdims=True)))[..., 0]


def scipy_lse(x):
    """+inf for a row holding +inf (its limit), NaN for a row holding a NaN."""
    return logsumexp(x, axis=-1).astype(x.dtype)


def nan_dropping(x):
    """Skips NaNs: a row holding one comes back finite."""
    w = x.astype(np.float64)
    m = np.nanmax(w, axis=-1, keepdims=True)
    return (m + np.log(np.nansum(np.exp(w - m), axis=-1, keepdims=True)))[..., 0].astype(x.dtype)


def inf_first(x):
    """scipy's, but +inf for any row holding +inf, a NaN beside it or not."""
    out = scipy_lse(x)
    return np.where(np.isposinf(x).any(axis=-1), np.inf, out).astype(x.dtype)


def wrong_sign(x):
    """scipy's, but -inf for a row holding +inf: the wrong infinity."""
    out = scipy_lse(x)
    return np.where(np.isposinf(out), -np.inf, out).astype(x.dtype)


def nan_beside_inf(inputs, rng):
    """A row holding a NaN and a +inf: the NaN is the data's, whatever the inf makes."""
    (x,) = inputs
    y = rng.standard_normal(x.shape).astype(x.dtype)
    y[0, 0], y[0, 1] = np.nan, np.inf
    return [(y,)]


pytest_arbiter.op("rk_lse", reference=lse_ref)
pytest_arbiter.candidate("rk_lse", target="cpu", name="rk_nan_dropping", tier=9)(nan_dropping)
pytest_arbiter.candidate("rk_lse", target="cpu", name="rk_scipy", tier=5)(scipy_lse)
pytest_arbiter.op("rk_lse2", reference=lse_ref, gate_inputs=nan_beside_inf)
pytest_arbiter.candidate("rk_lse2", target="cpu", name="rk_inf_first", tier=9)(inf_first)
pytest_arbiter.candidate("rk_lse2", target="cpu", name="rk_scipy2", tier=5)(scipy_lse)
pytest_arbiter.op("rk_lse3", reference=lse_ref)
pytest_arbiter.candidate("rk_lse3", target="cpu", name="rk_wrong_sign", tier=9)(wrong_sign)
pytest_arbiter.candidate("rk_lse3", target="cpu", name="rk_scipy3", tier=5)(scipy_lse)
'''

TEST = '''
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lse(dtype):
    x = np.random.default_rng(0).standard_normal((64, 100)).astype(dtype)
    for op in ("rk_lse", "rk_lse2", "rk_lse3"):
        out = pytest_arbiter.dispatch(op, x)
        np.testing.assert_allclose(out, np.log(np.exp(x.astype(np.float64)).sum(-1)),
                                   rtol=1e-5)
'''


def test_scipy_logsumexp_passes_and_a_nan_dropping_kernel_is_rejected(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(rk_lib=LIB)
    pytester.makeconftest("import rk_lib  # noqa: F401\n")
    pytester.makepyfile(test_rk=TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v",
                                           "--arbiter-histogram=h.json")
    out = result.stdout.str()
    # the top tier drops a special trial's NaN: rejected, on every dtype
    assert "cpu/rk_lse/rk_nan_dropping/rejected: 2" in out, out
    assert "not NaN where the reference is NaN" in out, out
    # scipy's +inf where the shifted reference made inf - inf = NaN is no failure
    assert "cpu/rk_lse/rk_scipy/won: 2" in out, out
    assert "rk_scipy/rejected" not in out, out
    # an infinity where a NaN input sits beside the inf is a NaN dropped: rejected
    assert "cpu/rk_lse2/rk_inf_first/rejected: 2" in out, out
    assert "cpu/rk_lse2/rk_scipy2/won: 2" in out, out
    # the infinity of the wrong sign is no limit: rejected
    assert "cpu/rk_lse3/rk_wrong_sign/rejected: 2" in out, out
    assert "cpu/rk_lse3/rk_scipy3/won: 2" in out, out
