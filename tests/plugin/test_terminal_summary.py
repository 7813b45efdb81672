"""The ``arbiter`` section of pytest's terminal summary respects the verbosity: a clean
run says what was dispatched, cached and gated in one line; a run with something to
look at (a new degrade, a measured key), ``-v`` and ``--arbiter-explain`` give the
details."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from pytest_arbiter.cli.main import main

# imported here, not first inside an in-process pytester run (which would unload them)
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import MeasureCache
from tests.factories import make_confident, ranked_entry

pytestmark = pytest.mark.usefixtures("clean_registry")

DISPATCH = """
import numpy as np
import pytest_arbiter


def test_dispatch():
    a = np.ones((4, 3), np.float32)
    b = np.ones((3, 2), np.float32)
    assert (pytest_arbiter.dispatch("matmul", a, b) == 3).all()
"""

DECLINING = """
import pytest_arbiter

pytest_arbiter.op("summary_mm", reference=lambda a, b: a @ b)


@pytest_arbiter.candidate("summary_mm", target="cpu", name="summary_declining", tier=9)
def k(a, b):
    raise pytest_arbiter.Decline("not yet")
"""


def section(result: pytest.RunResult) -> list[str]:
    """The lines of the ``arbiter`` section."""
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines)
                 if line.startswith("=") and " arbiter " in line)
    end = next(i for i in range(start + 1, len(lines))
               if re.match(r"=|\d+ (passed|failed)", lines[i]))
    return lines[start + 1:end]


@pytest.mark.parametrize("quiet", [["-q"], []], ids=["q", "default"])
def test_a_clean_run_is_one_line(pytester: pytest.Pytester, quiet: list[str]) -> None:
    pytester.makepyfile(test_one=DISPATCH)
    assert pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json").ret == 0
    make_confident(pytester.path / "c.json")
    result = pytester.runpytest(*quiet, "--arbiter-cache=c.json",
                                "--arbiter-baseline=base.json")
    assert result.ret == 0
    (line,) = section(result)
    assert line.startswith("cache ") and "1 entry read" in line
    assert "1 dispatch (1 won)" in line and "1 reused from cache" in line
    assert "degrade gate passed" in line and line.endswith("(-v for details)")


GAPPED = """
import time

import pytest_arbiter

pytest_arbiter.op("summary_twice", reference=lambda x: x * 2)


@pytest_arbiter.candidate("summary_twice", target="cpu", name="summary_fast")
def fast(x):
    return x * 2


@pytest_arbiter.candidate("summary_twice", target="cpu", name="summary_slow")
def slow(x):
    time.sleep(0.002)
    return x * 2
"""


def test_a_clean_recheck_run_says_so_in_its_one_line(pytester: pytest.Pytester) -> None:
    """A winner 2 ms ahead, re-timed: current, and the one line says it was re-timed."""
    pytester.makeconftest(GAPPED)
    pytester.makepyfile(test_one="""
import numpy as np
import pytest_arbiter


def test_dispatch():
    assert (pytest_arbiter.dispatch("summary_twice", np.ones(8)) == 2).all()
""")
    assert pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json").ret == 0
    (line,) = section(pytester.runpytest("-q", "--arbiter-cache=c.json",
                                         "--arbiter-recheck"))
    assert "; recheck: 1 re-timed, 1 current; " in line, line


def test_verbose_and_explain_give_the_details(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH)
    assert pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json").ret == 0
    verbose = section(pytester.runpytest("-v", "--arbiter-cache=c.json"))
    assert any(line.startswith("dispatch histogram") for line in verbose)
    assert "winners:" in verbose
    explain = section(pytester.runpytest("-q", "--arbiter-explain", "--arbiter-cache=c.json"))
    assert any("[cached]: ran " in line for line in explain), explain
    # a cached key's runners-up are as far behind as the paired ratio that ranked them,
    # the figure show prints, not the ratio of their medians
    from pytest_arbiter.store import artifacts

    (entry,) = artifacts.read_cache(pytester.path / "c.json").entries()
    for row in entry.ranking[1:]:
        assert row.ratio is not None
        said = f"passed over {row.name}: slower by {(row.ratio - 1) * 100:.1f}%"
        assert any(line.strip() == said for line in explain), (said, explain)


def test_a_measuring_run_lists_its_winners(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one=DISPATCH)
    lines = section(pytester.runpytest("-q", "--arbiter-tune", "--arbiter-cache=c.json"))
    assert "winners:" in lines and len(lines) > 1


def test_a_new_degrade_is_shown_in_full_even_quiet(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(DECLINING)
    pytester.makepyfile(test_one=DISPATCH.replace('"matmul"', '"summary_mm"'))
    result = pytester.runpytest("-q")
    assert result.ret == 1
    lines = section(result)
    text = "\n".join(lines)
    assert "new degraded: target=cpu op=summary_mm candidate=summary_declining" in text
    assert "reason: " in text and "tests: test_one.py::test_dispatch" in text
    assert "degrade gate FAILED" in text


def test_a_run_that_dispatches_nothing_prints_no_section(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="def test_nothing():\n    pass\n")
    result = pytester.runpytest("-q")
    assert result.ret == 0
    assert not any(" arbiter " in line for line in result.stdout.lines)


# -- pytest-arbiter show: 100 columns by default, every column with --wide -----------

LONG = "a_candidate_with_a_very_long_descriptive_name"
HOST = "a-long-runner-host-name.example.com"


def _show(tmp_path: Path, *argv: str) -> str:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([
        ranked_entry("128x128x128/a16.8.16", "wmma", "cublas", medians=(1000.0, 1500.0),
                     host=HOST),
        ranked_entry("64x64x64/a16.8.16", "wmma", "cublas", medians=(1000.0, 989.0), host=HOST),
        ranked_entry("32x32x32/a16.8.16", LONG, LONG + "_2", medians=(1000.0, 2000.0),
                     host=HOST)]))
    out = io.StringIO()
    assert main(["show", *argv, str(path)], out=out) == 0
    return out.getvalue()


def test_show_fits_100_columns_and_wide_shows_every_column(tmp_path: Path) -> None:
    text = _show(tmp_path)
    lines = text.splitlines()
    assert max(map(len, lines[:-1])) <= 100, text  # the last line: the count, prose
    assert lines[0].split() == ["key", "winner", "median", "runner-up", "confidence"]
    row = next(line for line in lines if line.startswith("sm_90/matmul/128x128x128"))
    assert "wmma" in row and "1.00 us" in row and "cublas +50.0%" in row
    # the runner-up whose median is lower, ranked second by the paired rounds, is marked
    # and the mark explained
    row = next(line for line in lines if line.startswith("sm_90/matmul/64x64x64"))
    assert "cublas -1.1%*" in row
    assert any(line.startswith("* faster where timed, yet ranked second") for line in lines)
    wide = _show(tmp_path, "--wide")
    assert max(map(len, wide.splitlines())) > 100
    assert LONG + "_2 +100.0%" in wide and HOST in wide


UNAVAILABLE = """
import pytest_arbiter

pytest_arbiter.op("sum_twice", reference=lambda x: x * 2)


@pytest_arbiter.candidate("sum_twice", target="cpu", name="sum_plain")
def plain(x):
    return x + x


@pytest_arbiter.candidate("sum_twice", target="cpu", name="sum_torch", tier=5,
                          available=lambda: "torch is not installed (pip install torch)")
def with_torch(x):
    import torch_not_here  # noqa: F401
    return x * 2
"""

TWICE = """
import numpy as np
import pytest_arbiter


def test_twice():
    assert (pytest_arbiter.dispatch("sum_twice", np.ones(4)) == 2).all()
"""


def test_a_candidate_unavailable_here_is_said_in_one_line_and_listed_with_v(
        pytester: pytest.Pytester) -> None:
    """The best-tier kernel of a dispatched op cannot run on this machine (its package is
    missing): never timed nor run here, so the clean run's one line says how many such
    candidates there are, and ``-v`` names each with its ``available()`` reason."""
    pytester.makeconftest(UNAVAILABLE)
    pytester.makepyfile(test_twice=TWICE)
    assert pytester.runpytest("--arbiter-tune", "--arbiter-cache=c.json").ret == 0
    (line,) = section(pytester.runpytest("--arbiter-cache=c.json"))
    assert "; 1 candidate unavailable here;" in line, line
    verbose = section(pytester.runpytest("-v", "--arbiter-cache=c.json"))
    at = verbose.index("1 candidate of the dispatched ops unavailable here (never timed "
                       "nor run on this machine):")
    assert verbose[at + 1] == ("  cpu/sum_twice/sum_torch (tier 5): torch is not installed "
                               "(pip install torch)")


@pytest.mark.slow
@pytest.mark.xdist
def test_a_candidate_unavailable_on_the_workers_is_listed_under_xdist(
        pytester: pytest.Pytester) -> None:
    """The ops are registered by a module only the tests import: the controller never
    registers them, so the workers say which of their candidates are unavailable."""
    pytest.importorskip("xdist")
    pytester.makepyfile(lib_ops=UNAVAILABLE)
    pytester.makepyfile(test_twice="import lib_ops  # noqa: F401\n" + TWICE)
    pytester.syspathinsert()
    result = pytester.runpytest_subprocess("-n", "2", "-v", "-p", "no:cacheprovider")
    lines = section(result)
    at = lines.index("1 candidate of the dispatched ops unavailable here (never timed "
                     "nor run on this machine):")
    assert lines[at + 1] == ("  cpu/sum_twice/sum_torch (tier 5): torch is not installed "
                             "(pip install torch)")


LAYOUTS = """
import numpy as np
import pytest_arbiter

pytest_arbiter.op("ex_twice", reference=lambda x: x * 2)


@pytest_arbiter.candidate("ex_twice", target="cpu", name="ex_rows", tier=3,
                          accepts=lambda x: x.flags.c_contiguous)
def rows(x):
    return x + x


@pytest_arbiter.candidate("ex_twice", target="cpu", name="ex_any")
def any_layout(x):
    return x * 2
"""

TWO_LAYOUTS = """
import numpy as np
import pytest_arbiter


def test_two_layouts():
    x = np.ones((4, 8))
    pytest_arbiter.dispatch("ex_twice", x)
    pytest_arbiter.dispatch("ex_twice", np.asfortranarray(x))
"""


def test_explain_never_passes_over_the_candidate_that_ran(pytester: pytest.Pytester) -> None:
    """One key, two layouts: the top candidate runs the first, declines the second,
    which the next one runs. ``--arbiter-explain`` names the one that ran last and says
    why the other did not; it never lists the one that ran as passed over."""
    pytester.makeconftest(LAYOUTS)
    pytester.makepyfile(test_two=TWO_LAYOUTS)
    lines = section(pytester.runpytest("--arbiter-explain"))
    at = next(i for i, line in enumerate(lines) if "ex_twice" in line and "]: ran " in line)
    assert lines[at].endswith("ran ex_any"), lines
    assert lines[at + 1] == ("  passed over ex_rows: ahead in the order, but it did not run "
                             "the key's last inputs"), lines
    assert not any("passed over ex_any" in line for line in lines), lines
