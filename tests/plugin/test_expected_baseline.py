"""A test that degrades on purpose (``arbiter_expect_degrade``) says nothing about the
baseline: ``--arbiter-write-baseline`` records what the unmarked tests did, so a real
degrade of the same kernel later is new; and a run whose only dispatches of an op are
on purpose still checked that op's baseline entries (fixed, not unchecked)."""

from __future__ import annotations

import json

import pytest

from pytest_arbiter.cli.main import main

pytestmark = pytest.mark.usefixtures("clean_registry")

CONFTEST = """
import numpy as np
import pytest_arbiter

pytest_arbiter.op("eb_halve", reference=lambda x: x / 2)


@pytest_arbiter.candidate("eb_halve", target="cpu", name="eb_fast",
                          accepts=lambda x: x.shape[0] % 8 == 0)
def fast(x):
    return x * np.asarray(0.5, x.dtype)
"""

TESTS = """
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.arbiter_expect_degrade
def test_on_purpose():
    pytest_arbiter.dispatch("eb_halve", np.ones(5))
    pytest_arbiter.dispatch("eb_halve", np.ones(8))  # the kernel runs here too


def test_clean():
    pytest_arbiter.dispatch("eb_halve", np.ones(16))
"""

UNEXPECTED = """

def test_unexpected():
    pytest_arbiter.dispatch("eb_halve", np.ones(9))
"""


def _entries(path: object) -> list[dict[str, object]]:
    with open(str(path)) as file:
        entries: list[dict[str, object]] = json.load(file)["entries"]
    return entries


def test_an_on_purpose_degrade_is_not_written_into_the_baseline(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_halve=TESTS)
    wrote = pytester.runpytest("--arbiter-write-baseline=base.json", "-rN")
    assert wrote.ret == 0
    # the run records its entries: it does not say that every one of them is new
    assert "every degraded, rejected or error entry is new" not in wrote.stdout.str()
    wrote.stdout.fnmatch_lines(["*--arbiter-write-baseline *base.json records this run's*"])
    assert [e for e in _entries(pytester.path / "base.json")
            if e["outcome"] == "degraded"] == []
    # an unmarked test's degrade of the same kernel is new against that baseline
    pytester.makepyfile(test_halve=TESTS + UNEXPECTED)
    result = pytester.runpytest("--arbiter-baseline=base.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*new degraded: target=cpu op=eb_halve candidate=eb_fast*",
                                 "*tests: test_halve.py::test_unexpected*"])


def test_an_op_dispatched_only_on_purpose_still_checks_its_baseline_entries(
        pytester: pytest.Pytester) -> None:
    """The baseline knows eb_fast's degrade (written when an unmarked test did it); now
    the op's only dispatches are the on-purpose test's, where eb_fast also runs: the
    entry is fixed, in the run and in the fleet gate of its JUnit file, and ``gate
    --update`` drops it."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_halve=TESTS + UNEXPECTED)
    assert pytester.runpytest("--arbiter-write-baseline=base.json").ret == 0
    assert any(e["outcome"] == "degraded" for e in _entries(pytester.path / "base.json"))
    pytester.makepyfile(test_halve=TESTS.split("\n\ndef test_clean")[0])
    result = pytester.runpytest("--arbiter-baseline=base.json", "--junitxml=r.xml")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*fixed degraded: target=cpu op=eb_halve candidate=eb_fast*"])
    assert "not checked" not in result.stdout.str()
    assert main(["gate", "--baseline", str(pytester.path / "base.json"),
                 str(pytester.path / "r.xml"), "--update"]) == 0
    assert [e for e in _entries(pytester.path / "base.json")
            if e["outcome"] == "degraded"] == []
