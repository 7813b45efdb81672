"""Retries and repeats count once: a test pytest-rerunfailures runs again records its
last attempt only (the histogram, the JUnit testcase and the suite totals agree, so the
gate reads the run's own report); pytest-repeat's copies are tests of their own; a test
using the pytest-benchmark fixture counts each of its entries once, however many timing
rounds called the code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FLAKY = '''
import numpy as np
import pytest_arbiter

ATTEMPTS = {"n": 0}


def test_flaky():
    x = np.ones((4, 8), np.float32)
    pytest_arbiter.dispatch("softmax", x)
    pytest_arbiter.dispatch("softmax", x)
    ATTEMPTS["n"] += 1
    assert ATTEMPTS["n"] > 1, "fails on its first attempt"


def test_steady():
    pytest_arbiter.dispatch("softmax", np.ones((4, 8), np.float32))
'''

BENCH = '''
import numpy as np
import pytest_arbiter


def test_timed(benchmark):
    x = np.ones((4, 8), np.float32)
    benchmark(lambda: pytest_arbiter.dispatch("softmax", x))
'''


def total(path: Path) -> int:
    return sum(e["count"] for e in json.loads(path.read_text())["entries"])


def gate(*reports: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_arbiter.cli.main", "gate", "--baseline",
                           str(reports[0].with_name("b.json")), *map(str, reports)],
                          capture_output=True, text=True, check=False)


@pytest.mark.parametrize("workers", [
    pytest.param([], id="n0"), pytest.param(["-n", "2"], id="n2", marks=pytest.mark.xdist)])
def test_a_rerun_test_counts_its_last_attempt(pytester: pytest.Pytester,
                                              workers: list[str]) -> None:
    if workers:
        pytest.importorskip("xdist")
    pytester.makepyfile(test_flaky=FLAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--reruns", "1",
                                           "--junitxml=j.xml", "--arbiter-histogram=h.json",
                                           *workers)
    assert result.ret == 0, result.stdout.str()
    assert result.parseoutcomes().get("rerun") == 1, result.stdout.str()
    assert total(pytester.path / "h.json") == 3  # 2 + 1, not 2 + 2 + 1
    done = gate(pytester.path / "j.xml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_repeated_copies_are_tests_of_their_own(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_flaky=FLAKY.replace("assert ATTEMPTS", "# assert ATTEMPTS"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--count", "3",
                                           "--junitxml=j.xml", "--arbiter-histogram=h.json")
    assert result.ret == 0, result.stdout.str()
    assert total(pytester.path / "h.json") == 3 * 3
    assert gate(pytester.path / "j.xml").returncode == 0


def test_a_benchmarked_test_counts_each_entry_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=j.xml",
                                           "--arbiter-histogram=h.json")
    assert result.ret == 0, result.stdout.str()
    assert total(pytester.path / "h.json") == 1
    assert gate(pytester.path / "j.xml").returncode == 0
