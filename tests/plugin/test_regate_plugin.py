"""Issue 27, point 7, on a small real project (pytester): a tuning run in which a user op's
fastest kernel overflows on the large magnitudes of one key's gate does not let it win
another key whose test inputs never get large, and the cache file records the trials
each timed candidate passed. Fails on the code before point 7 (see the note)."""

from __future__ import annotations

import pytest

from pytest_arbiter.store import artifacts

CONFTEST = '''
import time

import numpy as np
import pytest_arbiter


def lse_ref(x):
    w = x.astype(np.float64)
    m = w.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(w - m).sum(axis=-1, keepdims=True)))[..., 0]


pytest_arbiter.op("p7_lse", reference=lse_ref)


@pytest_arbiter.candidate("p7_lse", target="cpu", name="p7_naive", tier=9)
def naive(x):
    return np.log(np.exp(x.astype(np.float32)).sum(axis=-1)).astype(x.dtype)


@pytest_arbiter.candidate("p7_lse", target="cpu", name="p7_shifted", tier=1)
def shifted(x):
    time.sleep(0.0003)  # slower than the naive kernel: it wins wherever that one fails
    w = x.astype(np.float32)
    m = w.max(axis=-1, keepdims=True)
    return (m[..., 0] + np.log(np.exp(w - m).sum(axis=-1))).astype(x.dtype)
'''

TESTS = '''
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.arbiter_expect_degrade
def test_ordinary_logits():
    x = np.random.default_rng(0).standard_normal((8, 300)).astype(np.float32)
    assert np.isfinite(pytest_arbiter.dispatch("p7_lse", x)).all()


@pytest.mark.arbiter_expect_degrade
def test_logits_on_a_grid():
    x = np.random.default_rng(3).integers(-3, 3, (16, 64)).astype(np.float32)
    assert np.isfinite(pytest_arbiter.dispatch("p7_lse", x)).all()
'''


def test_a_kernel_that_overflowed_on_one_key_does_not_win_another(
        pytester: pytest.Pytester) -> None:
    """Before: the naive logsumexp, rejected for overflow on the 8x300 key, passed the
    grid key's own gate and was written its winner."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_lse=TESTS)
    result = pytester.runpytest_subprocess("--arbiter-tune", "--arbiter-cache=cache.json",
                                           "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    entries = {e.bucket: e for e in artifacts.read_cache(pytester.path / "cache.json")}
    ordinary = next(e for b, e in entries.items() if b.startswith("8x512"))
    grid = next(e for b, e in entries.items() if b.startswith("16x64"))
    assert ordinary.winner == grid.winner == "p7_shifted"
    naive = grid.considered["p7_naive"]
    assert naive.outcome == "rejected"
    assert "large_magnitude pattern first failed it on bucket 8x512" in naive.reason
    assert ordinary.considered["p7_shifted"].trials == (
        "own", "fresh", "large_magnitude", "large_offset", "special")
    assert grid.considered["p7_shifted"].trials == ("own",)
    assert '"trials":["own"]' in (pytester.path / "cache.json").read_text()
