"""Hostile input to the plugin: an unreadable baseline or a file name with a line break
is a usage error that prints the name escaped, names in the summary are escaped, and an
incomplete xdist run says so in its report."""

from __future__ import annotations

import pytest

from pytest_arbiter.gating import histogram_file
from tests.hostile import EVIL, HOSTILE_JSON, assert_clear_error, assert_safe_output, run_cli

DECLINING = """
import pytest_arbiter

pytest_arbiter.op("hostile_mm", reference=lambda a, b: a @ b)

@pytest_arbiter.candidate("hostile_mm", target="cpu", name="k", tier=9)
def k(a, b):
    raise pytest_arbiter.Decline(NAME)
"""


DISPATCH = """
import numpy as np

def test_dispatch(arbiter):
    arbiter.dispatch("hostile_mm", np.ones((4, 3), np.float32), np.ones((3, 2), np.float32))
"""


@pytest.mark.usefixtures("clean_registry")
@pytest.mark.parametrize("name", ["deep-object", "lone-surrogate", "duplicate-key", "bom",
                                  "not-utf8", "unknown-field", "overflow"])
def test_an_unreadable_baseline_is_a_usage_error_naming_it(pytester: pytest.Pytester,
                                                           name: str) -> None:
    pytester.makepyfile(test_one=DISPATCH.replace("hostile_mm", "matmul"))
    (pytester.path / "base.json").write_bytes(HOSTILE_JSON[name][0])
    result = pytester.runpytest("--arbiter-baseline=base.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    result.stderr.fnmatch_lines(["*--arbiter-baseline: cannot use *base.json*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.usefixtures("clean_registry")
def test_the_summary_escapes_names(pytester: pytest.Pytester) -> None:
    """A name a kernel cannot register, a decline's reason, a name a baseline file holds:
    each is printed escaped (and registration refuses the name with the rule)."""
    from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate

    with pytest.raises(ValueError, match=r"candidate name .* is not allowed"):
        CandidateRegistry().add(FunctionCandidate(len, EVIL, "matmul", "cpu", 0, None, None))
    pytester.makeconftest(f"NAME = {EVIL!r}\n" + DECLINING)
    pytester.makepyfile(test_one=DISPATCH)
    baseline = pytester.path / "base.json"
    histogram_file.write_histogram(
        baseline, {("cpu", "hostile_mm", "gone\n::error::x", "degraded"): 1})
    result = pytester.runpytest("--arbiter-baseline=base.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    summary = result.stdout.str().split("= arbiter =")[1]
    assert "reason: k\\n::error file=ci.yml::pwned\\x1b[2J" in summary
    assert "gone\\n::error::x" in summary
    assert_safe_output(summary)


@pytest.mark.usefixtures("clean_registry")
@pytest.mark.xdist
def test_an_incomplete_run_says_so_in_its_report(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_one="""
        import os
        import numpy as np

        def test_dispatch(arbiter):
            arbiter.dispatch("matmul", np.ones((4, 3), np.float32), np.ones((3, 2), np.float32))

        def test_crash():
            os._exit(3)
    """)
    # pytest-benchmark warns that xdist disables it; this project runs with -W error
    result = pytester.runpytest("-n", "2", "-p", "no:benchmark", "--junitxml=r.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = pytester.path / "r.xml"
    assert 'name="arbiter-incomplete" value="worker gw' in report.read_text()
    assert_clear_error(run_cli("gate", "--baseline", pytester.path / "b.json", report), report,
                       "the run's dispatch counts are incomplete (worker gw")


def test_a_usage_error_prints_the_path_escaped(pytester: pytest.Pytester) -> None:
    """A file name with a line break cannot forge a CI log command in a usage error."""
    evil = "b\n::error file=ci.yml::pwned.json"
    (pytester.path / evil).write_text("{not json")
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess(f"--arbiter-baseline={evil}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--arbiter-baseline: cannot use" in err and "b\\n::error" in err
    assert not any(line.startswith("::error") for line in err.splitlines()), err
