"""Issue 27: users' own ops gated as strongly as the built-in ones, on small real projects
(pytester). Each test fails on the code before the issue: see the note on each."""

from __future__ import annotations

import pytest

LIB = '''
import numpy as np
import pytest_arbiter


def lse_ref(x):
    w = x.astype(np.float64)
    m = w.max(axis=-1, keepdims=True)
    return (m + np.log(np.exp(w - m).sum(axis=-1, keepdims=True)))[..., 0]


def shifted(x):
    w = x.astype(np.float32)
    m = w.max(axis=-1, keepdims=True)
    return (m[..., 0] + np.log(np.exp(w - m).sum(axis=-1))).astype(x.dtype)


def naive(x):
    return np.log(np.exp(x.astype(np.float32)).sum(axis=-1)).astype(x.dtype)


def global_max(x):
    w = x.astype(np.float32)
    m = w.max()
    return (m + np.log(np.exp(w - m).sum(axis=-1))).astype(x.dtype)
'''

DERIVED = LIB + '''
pytest_arbiter.op("t27_lse", reference=lse_ref)
pytest_arbiter.candidate("t27_lse", target="cpu", name="t27_naive", tier=9)(naive)
pytest_arbiter.candidate("t27_lse", target="cpu", name="t27_global", tier=8)(global_max)
pytest_arbiter.candidate("t27_lse", target="cpu", name="t27_shifted", tier=1)(shifted)
'''

LARGE_LOGITS_TEST = '''
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.arbiter_expect_degrade
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_large_logits_stay_finite(dtype):
    rng = np.random.default_rng(1)
    small = rng.standard_normal((8, 300)).astype(dtype)
    pytest_arbiter.dispatch("t27_lse", small)  # the key's first dispatch: ordinary logits
    large = (rng.standard_normal((8, 300)) + 1000.0 + 64 * np.arange(8)[:, None]).astype(dtype)
    out = pytest_arbiter.dispatch("t27_lse", large)
    assert np.isfinite(out.astype(np.float64)).all(), out
'''


def test_derived_trials_reject_a_missing_max_shift_and_a_global_max(
        pytester: pytest.Pytester) -> None:
    """Point 2. Before: both kernels passed on the ordinary logits of the first dispatch,
    the naive one won the key, and the large logits came back inf."""
    pytester.makeconftest(DERIVED)
    pytester.makepyfile(test_lse=LARGE_LOGITS_TEST)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*t27_naive*rejected*", "*t27_global*rejected*"])


GIVEN = LIB + '''
def big_logits(inputs, rng):
    (x,) = inputs
    return [(rng.standard_normal(x.shape).astype(x.dtype) * 30 + 500,),
            (np.zeros((2, 5000), x.dtype) + 700,)]


pytest_arbiter.op("t27_lse", reference=lse_ref, gate_inputs=big_logits,
                  validate=lambda x: None)
pytest_arbiter.candidate("t27_lse", target="cpu", name="t27_naive", tier=9)(naive)
pytest_arbiter.candidate("t27_lse", target="cpu", name="t27_shifted", tier=1)(shifted)
'''


def test_gate_inputs_of_the_users_own_reach_the_gate(pytester: pytest.Pytester) -> None:
    """Point 1. Before: ``op()`` had no ``gate_inputs`` (TypeError at import)."""
    pytester.makeconftest(GIVEN)
    pytester.makepyfile(test_lse=LARGE_LOGITS_TEST + '''

def test_the_gate_ran_the_users_inputs(arbiter):
    x = np.random.default_rng(2).standard_normal((8, 300)).astype("float32")
    report = arbiter.arbiter.gate("t27_shifted", x)
    assert report.passed, report.summary()
    # the dispatch's, the op's own gate inputs, then the derived trials: added, not replaced
    assert [t.shapes for t in report.trials] == ["8x300", "8x300", "2x5000", *["8x300"] * 4]
    assert report.trials[1].input == "gate_inputs #0"
    assert report.trials[3].input.startswith("fresh values")
''')
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*t27_naive*rejected*"])


STATS = '''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("t27_scale", reference=lambda x: x.astype(np.float64) * 3.0)


@pytest_arbiter.candidate("t27_scale", target="cpu", name="t27_scale_f32")
def scale(x):
    return (x.astype(np.float32) * np.float32(3.0)).astype(x.dtype)
'''


def test_the_statistical_checks_run_on_a_user_ops_random_trials(
        pytester: pytest.Pytester) -> None:
    """Point 3. Before: a user op was gated on the dispatch's inputs alone, where the bias
    and spread checks never run (every trial's ``bias`` was 0)."""
    pytester.makeconftest(STATS)
    pytester.makepyfile(test_stats='''
import numpy as np
import pytest


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_stats(arbiter, dtype):
    import ml_dtypes  # noqa: F401  (bfloat16 arrays)

    x = np.random.default_rng(3).standard_normal((16, 256)).astype(dtype)
    report = arbiter.arbiter.gate("t27_scale_f32", x)
    assert report.passed, report.summary()
    fresh = [t for t in report.trials if t.input.startswith("fresh values")]
    assert fresh and fresh[0].spread != 0, fresh  # 0 where the checks did not run
''')
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=2)


ARGMAX = '''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("t27_argmax", reference=lambda x: np.argmax(x, axis=-1))


@pytest_arbiter.candidate("t27_argmax", target="cpu", name="t27_argmax_plus_one", tier=5)
def plus_one(x):
    return np.argmax(x, axis=-1) + 1


@pytest_arbiter.candidate("t27_argmax", target="cpu", name="t27_argmax_ok", tier=1)
def right(x):
    return np.argmax(x, axis=-1)
'''


def test_an_index_one_too_high_fails_in_every_dtype(pytester: pytest.Pytester) -> None:
    """Point 4. Before: the default budget of an integer output took its unit from the
    bfloat16 input, so an index of 200 one too high passed, won and ran."""
    pytester.makeconftest(ARGMAX)
    pytester.makepyfile(test_argmax='''
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.arbiter_expect_degrade
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_argmax(dtype):
    import ml_dtypes  # noqa: F401

    x = np.random.default_rng(4).standard_normal((8, 300))
    x[:, 200] = 10.0  # every row's maximum at index 200
    x = x.astype(dtype)
    assert (pytest_arbiter.dispatch("t27_argmax", x) == 200).all()
''')
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*t27_argmax_plus_one*rejected*"])


SCALARS = '''
import numpy as np
import pytest_arbiter


def rms_ref(x, w, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


@pytest_arbiter.candidate("t27_rms", target="cpu", name="t27_rms_f32")
def rms(x, w, eps):
    y = x.astype(np.float32)
    return (y / np.sqrt((y * y).mean(axis=-1, keepdims=True) + np.float32(eps)) * w
            ).astype(x.dtype)


def gather_ref(table, index):
    return table[index]


@pytest_arbiter.candidate("t27_gather", target="cpu", name="t27_take")
def take(table, index):
    return np.take(table, index, axis=0)


pytest_arbiter.op("t27_rms", reference=rms_ref)
pytest_arbiter.op("t27_gather", reference=gather_ref)
'''


def test_integer_boolean_and_plain_number_inputs(pytester: pytest.Pytester) -> None:
    """Point 5. Before: ``input 2 must be an array with shape and dtype, got float`` and
    ``unsupported dtype int64``."""
    pytester.makeconftest(SCALARS)
    pytester.makepyfile(test_inputs='''
import numpy as np
import pytest
import pytest_arbiter
from pytest_arbiter.core.ops import OPS


def test_a_plain_float_is_passed_through_and_named_in_the_key():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = np.ones(64, np.float32)
    out = pytest_arbiter.dispatch("t27_rms", x, w, 1e-6)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(out, want, rtol=1e-5)
    assert OPS.get("t27_rms").region_of(x, w, 1e-6).dtype == "float32,float32,py_float"
    assert OPS.get("t27_rms").region_of(x, w, 1).dtype == "float32,float32,py_int"


def test_integer_index_arrays():
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    index = np.array([3, 1, 4, 1, 5], dtype=np.int64)
    np.testing.assert_array_equal(pytest_arbiter.dispatch("t27_gather", table, index),
                                  table[index])
    mask = np.array([True, False] * 5)
    np.testing.assert_array_equal(pytest_arbiter.dispatch("t27_gather", table, mask),
                                  table[mask])


def test_a_built_in_op_names_the_dtypes_it_supports():
    a = np.ones((4, 4), np.int64)
    with pytest.raises(ValueError, match="matmul supports float64, float32, float16, bfloat16"):
        pytest_arbiter.dispatch("matmul", a, a)
''')
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=3)


MISSPELT = '''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("t27_pdist", reference=lambda x: np.abs(x[:, None] - x[None, :]))


@pytest_arbiter.candidate("t27_pdist_2", target="cpu", name="t27_fast_pdist")
def fast_pdist(x):
    return np.abs(x[:, None] - x[None, :])
'''


def test_a_candidate_for_an_unknown_op_is_named(pytester: pytest.Pytester) -> None:
    """Point 6. Before: the candidate was accepted and never used, without a word."""
    pytester.makeconftest(MISSPELT)
    pytester.makepyfile(test_pdist='''
import numpy as np
import pytest_arbiter


def test_dispatch():
    x = np.arange(5, dtype=np.float32)
    pytest_arbiter.dispatch("t27_pdist", x)
''')
    result = pytester.runpytest_subprocess("-W", "default")
    result.assert_outcomes(passed=1)
    line = ("candidate 't27_fast_pdist' (*conftest.py:7) is registered for op 't27_pdist_2',"
            " which no op() registers and no built-in has: it is never used; closest known:"
            " t27_pdist*")
    result.stdout.fnmatch_lines([f"*UnknownOpWarning: {line}", "*= arbiter =*", line])


def test_gate_region_on_a_user_op_says_what_is_missing(pytester: pytest.Pytester) -> None:
    """Point 6. Before: "the candidate declined every gate input", though nothing was
    declined."""
    pytester.makeconftest(MISSPELT.replace('"t27_pdist_2"', '"t27_pdist"'))
    pytester.makepyfile(test_region='''
from pytest_arbiter.core.regions import Region


def test_region(arbiter):
    arbiter.gate_region("t27_fast_pdist", Region("t27_pdist", ((5,),), "float32"))
''')
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*nothing to check: op 't27_pdist' is a user op*"])
    result.stdout.no_fnmatch_line("*declined every gate input*")
