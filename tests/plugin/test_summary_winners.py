"""The summary's ``winners:`` line names the candidate each key's dispatches ran, and the
cached winner when that is another one."""

from __future__ import annotations

import pytest

# imported before pytester's in-process runs, which drop modules they imported
from pytest_arbiter.store import artifacts  # noqa: F401

pytestmark = pytest.mark.usefixtures("clean_registry")

CONFTEST = """
import time

import pytest_arbiter

pytest_arbiter.op("summary_scale", reference=lambda x: x * 2)


# the fast one runs only inputs whose first value is not negative
@pytest_arbiter.candidate("summary_scale", target="cpu", name="summary_fast", tier=1,
                          accepts=lambda x: x[0] >= 0)
def fast(x):
    return x * 2


@pytest_arbiter.candidate("summary_scale", target="cpu", name="summary_slow")
def slow(x):
    time.sleep(0.002)
    return x * 2
"""

TUNE_TEST = """
import numpy as np
import pytest_arbiter


def test_tune():
    pytest_arbiter.dispatch("summary_scale", np.ones(8))
"""

# the same key and shapes, but the cached winner declines these inputs: the other
# candidate runs, a silent fallback from the measured winner (degraded)
DECLINED_TEST = TUNE_TEST.replace("np.ones(8)", "-np.ones(8)")


def test_winner_line_names_the_candidate_that_ran(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_one=TUNE_TEST)
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["winners:", "  cpu/summary_scale/*: summary_fast (measured)"])

    pytester.makepyfile(test_one=DECLINED_TEST)
    result = pytester.runpytest("--arbiter-cache=c.json")
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines([
        "winners:",
        "  cpu/summary_scale/*: summary_slow (reused from cache; the cached winner "
        "summary_fast could not run here: degraded)",
        "new degraded: target=cpu op=summary_scale candidate=summary_fast (1 dispatch)",
        "    reason: the measured winner summary_fast could not run here (it declined "
        "inputs of the shapes it was measured on: *); summary_slow ran instead, *x slower "
        "when measured"])


# the fast one is wrong where the first value is 5: the gate rejects it on such inputs
WRONG_AT_FIVE = CONFTEST.replace("def fast(x):\n    return x * 2",
                                 "def fast(x):\n    return x * 3 if x[0] == 5 else x * 2")


def test_winner_line_says_the_gate_rejected_the_cached_winner(
        pytester: pytest.Pytester) -> None:
    """The line reads why the winner did not serve from a typed field: a winner the F4
    gate rejected on these inputs is not said to have declined them."""
    pytester.makeconftest(WRONG_AT_FIVE)
    pytester.makepyfile(test_one=TUNE_TEST)
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json")
    assert result.ret == 0, result.stdout.str()

    pytester.makepyfile(test_one=TUNE_TEST.replace("np.ones(8)", "np.full(8, 5.0)"))
    result = pytester.runpytest("--arbiter-cache=c.json")
    assert result.ret == 1, result.stdout.str()
    result.stdout.fnmatch_lines([
        "winners:",
        "  cpu/summary_scale/*: summary_slow (reused from cache; the cached winner "
        "summary_fast was rejected by the F4 gate on these inputs)"])
    assert "declined these inputs" not in result.stdout.str()
