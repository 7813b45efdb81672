"""The reason behind each failing entry travels in the JUnit report: the run writes it
next to the test's counts (``arbiter-reason:...``), and ``pytest-arbiter gate`` and the
report page read it back, escaped and cut, the last attempt of a rerun only. Every run
here is a real pytest run in a process of its own (the conftests register candidates)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.cli.report_problems import DEFAULT_REASONS
from pytest_arbiter.gating.histogram import HistogramKey
from pytest_arbiter.gating.junit import MAX_REASON_CHARS, read_report
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import MeasureCache
from tests.hostile import assert_safe_output

NOT_HERE = "numba is not installed on this runner"

LSE_CONFTEST = f'''
import os

import numpy as np
import pytest_arbiter


def lse(x):
    top = x.max(axis=-1, keepdims=True)
    return (top + np.log(np.exp(x - top).sum(axis=-1, keepdims=True)))[..., 0]


pytest_arbiter.op("rs_lse", reference=lse)
pytest_arbiter.op("rs_scale", reference=lambda x: x * 2.0)


@pytest_arbiter.candidate("rs_lse", target="cpu", name="rs_fast", tier=2,
                          available=lambda: os.environ.get("RS_TUNE") == "1"
                          or "{NOT_HERE}")
def rs_fast(x):
    return lse(x)


if os.environ.get("RS_TUNE") != "1":  # measured alone: no timing decides the winner
    @pytest_arbiter.candidate("rs_lse", target="cpu", name="rs_loop", tier=1)
    def rs_loop(x):
        return lse(x)


@pytest_arbiter.candidate("rs_scale", target="cpu", name="rs_wrong", tier=3)
def rs_wrong(x):
    return x * 2.5
'''

LSE_TESTS = '''
import numpy as np
import pytest_arbiter


def test_lse():
    pytest_arbiter.dispatch("rs_lse", np.ones((4, 64)))


def test_scale():
    np.testing.assert_allclose(pytest_arbiter.dispatch("rs_scale", np.ones(8)), 2.0)
'''

DEGRADED = HistogramKey("cpu", "rs_lse", "rs_fast", "degraded")
REJECTED = HistogramKey("cpu", "rs_scale", "rs_wrong", "rejected")


def run_cli(*argv: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    code = main([str(a) for a in argv], out=out)
    return code, out.getvalue()


def reasons_under(out: str, head: str) -> list[str]:
    """The ``  reason:`` lines right under the line that starts with ``head``."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(head))
    found = []
    for line in lines[at + 1:]:
        if not line.startswith("  "):
            break
        found.append(line)
    return found


@pytest.fixture
def replayed(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tuned where rs_fast runs, replayed where it is unavailable (a degrade) with
    rs_wrong failing the F4 gate (a rejection): the run's JUnit report and histogram."""
    pytester.makeconftest(LSE_CONFTEST)
    pytester.makepyfile(test_rs=LSE_TESTS)
    monkeypatch.setenv("RS_TUNE", "1")
    tune = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--arbiter-tune",
                                         "--arbiter-cache=c.json", "-k", "lse")
    assert tune.ret == 0, tune.stdout.str()
    monkeypatch.delenv("RS_TUNE")
    replay = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--arbiter-cache=c.json",
                                           "--junitxml=j.xml", "--arbiter-histogram=h.json")
    assert replay.ret == 1, replay.stdout.str()
    return pytester.path


def test_gate_prints_the_reason_of_each_new_entry(replayed: Path) -> None:
    code, out = run_cli("gate", "--baseline", replayed / "b.json", replayed / "j.xml")
    assert code == 1, out
    degraded = reasons_under(out, "NEW degraded: target=cpu op=rs_lse candidate=rs_fast")
    assert len(degraded) == 1 and degraded[0].startswith("  reason: the measured winner "
                                                         "rs_fast could not run here"), out
    assert f"(unavailable: {NOT_HERE})" in degraded[0] and "rs_loop ran" in degraded[0]
    rejected = reasons_under(out, "NEW rejected: target=cpu op=rs_scale candidate=rs_wrong")
    assert len(rejected) == 1 and rejected[0].startswith("  reason: failed the F4 gate"), out
    assert set(read_report(replayed / "j.xml").reasons) == {DEGRADED, REJECTED}
    # the run's histogram file has no reasons (nor tests): the same lines without them
    code, plain = run_cli("gate", "--baseline", replayed / "b.json", replayed / "h.json")
    assert code == 1 and "reason:" not in plain, plain
    assert [line.split(") in ")[0] for line in plain.splitlines()[1:]] == [
        line.split(") in ")[0] for line in out.splitlines()[1:]
        if not line.startswith("  reason: ")]


def test_a_known_entry_prints_no_reason(replayed: Path) -> None:
    from pytest_arbiter.gating import histogram_file

    histogram_file.write_histogram(replayed / "b.json", {DEGRADED: 1})
    code, out = run_cli("gate", "--baseline", replayed / "b.json", replayed / "j.xml")
    assert code == 1 and "known degraded: target=cpu op=rs_lse" in out, out
    assert [line for line in out.splitlines() if "reason:" in line] == [
        reasons_under(out, "NEW rejected")[0]], out


def test_the_report_shows_the_recorded_reason(replayed: Path) -> None:
    pytest.importorskip("matplotlib")
    page = replayed / "page.html"
    code, out = run_cli("report", replayed / "c.json", replayed / "j.xml", "-o", page)
    assert code == 0, out
    text = page.read_text()
    problems = text[text.index('id="problems"'):text.index("</section>",
                                                           text.index('id="problems"'))]
    assert NOT_HERE in problems and "failed the F4 gate" in problems, problems
    assert DEFAULT_REASONS["degraded"] not in problems
    assert DEFAULT_REASONS["rejected"] not in problems


HOSTILE = "first line\n::error::pwned\x1b[31m]]>" + "y" * 10_000

HOSTILE_CONFTEST = f'''
import pytest_arbiter

pytest_arbiter.op("hx_op", reference=lambda x: x + 1)


@pytest_arbiter.candidate("hx_op", target="cpu", name="hx_declines")
def hx_declines(x):
    raise pytest_arbiter.Decline({HOSTILE!r})
'''

ONE_DISPATCH = '''
import numpy as np
import pytest_arbiter


def test_hx():
    pytest_arbiter.dispatch("hx_op", np.ones(4))
'''


def test_a_hostile_reason_is_escaped_and_cut(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(HOSTILE_CONFTEST)
    pytester.makepyfile(test_hx=ONE_DISPATCH)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=j.xml")
    assert result.ret == 1, result.stdout.str()
    # the run's own summary: the same one line, cut as the report records it
    (said,) = [line for line in result.stdout.lines if line.startswith("    reason: ")]
    assert "first line\\n::error::pwned\\x1b[31m]]>yyy" in said
    assert len(said) <= len("    reason: ") + MAX_REASON_CHARS
    code, out = run_cli("gate", "--baseline", pytester.path / "b.json",
                        pytester.path / "j.xml")
    assert code == 1, out
    assert_safe_output(out)
    reason = reasons_under(out, "NEW degraded: target=cpu op=hx_op candidate=hx_declines")
    assert len(reason) == 1, out
    assert "first line\\n::error::pwned\\x1b[31m]]>yyy" in reason[0]
    assert len(reason[0]) <= len("  reason: ") + MAX_REASON_CHARS
    assert reason[0].endswith(" more characters)"), reason[0]

    pytest.importorskip("matplotlib")
    artifacts.write_cache(pytester.path / "c.json", MeasureCache([]))
    page = pytester.path / "page.html"
    code, out = run_cli("report", pytester.path / "c.json", pytester.path / "j.xml",
                        "-o", page)
    assert code == 0, out
    text = page.read_text()
    assert "\x1b" not in text and "]]>" not in text
    assert "first line\\n::error::pwned\\x1b[31m]]&gt;yyy" in text
    assert "y" * (MAX_REASON_CHARS + 1) not in text


RERUN_CONFTEST = '''
import pytest_arbiter

for attempt in ("first", "second"):
    pytest_arbiter.op(f"rr_{attempt}", reference=lambda x: x + 1)

    @pytest_arbiter.candidate(f"rr_{attempt}", target="cpu", name=f"rr_{attempt}_k")
    def declines(x, attempt=attempt):
        raise pytest_arbiter.Decline(f"declined on the {attempt} attempt")
'''

FLAKY = '''
import numpy as np
import pytest_arbiter

ATTEMPTS = {"n": 0}


def test_flaky():
    ATTEMPTS["n"] += 1
    pytest_arbiter.dispatch("rr_first" if ATTEMPTS["n"] == 1 else "rr_second", np.ones(4))
    assert ATTEMPTS["n"] > 1, "fails on its first attempt"
'''


def test_a_rerun_test_gives_the_reason_of_its_last_attempt(pytester: pytest.Pytester
                                                            ) -> None:
    pytester.makeconftest(RERUN_CONFTEST)
    pytester.makepyfile(test_flaky=FLAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--reruns", "1",
                                           "--junitxml=j.xml")
    assert result.parseoutcomes().get("rerun") == 1, result.stdout.str()
    # only the last attempt counts, whether the file holds both attempts (pytest 9 with
    # pytest-rerunfailures 16) or the last alone (the lowest versions CI installs)
    code, out = run_cli("gate", "--baseline", pytester.path / "b.json",
                        pytester.path / "j.xml")
    assert code == 1, out
    assert [line for line in out.splitlines() if line.startswith("NEW")] == [
        "NEW degraded: target=cpu op=rr_second candidate=rr_second_k (1 dispatch) in "
        "test_flaky.py::test_flaky"], out
    assert reasons_under(out, "NEW degraded") == [
        "  reason: declined on the second attempt"], out
    assert read_report(pytester.path / "j.xml").reasons == {
        HistogramKey("cpu", "rr_second", "rr_second_k", "degraded"):
            {"declined on the second attempt"}}


OUTSIDE_CONFTEST = '''
import numpy as np
import pytest_arbiter

pytest_arbiter.op("ox_op", reference=lambda x: x * 2.0)


@pytest_arbiter.candidate("ox_op", target="cpu", name="ox_raises", tier=2)
def raises(x):
    raise ValueError("array must not contain infs or NaNs")


@pytest_arbiter.candidate("ox_op", target="cpu", name="ox_right")
def right(x):
    return x * 2.0
'''


def test_an_entry_outside_any_test_keeps_its_reason_in_the_report(
        pytester: pytest.Pytester) -> None:
    """A failing kernel dispatched at collection time counts outside any test: its reason
    is a suite property, so ``gate`` and the report say it, not a generic line."""
    pytester.makeconftest(OUTSIDE_CONFTEST)
    pytester.makepyfile(test_ok="import numpy as np\nimport pytest_arbiter\n\n"
                        "pytest_arbiter.dispatch('ox_op', np.ones(4))  # collection time\n\n"
                        "def test_ok():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=j.xml")
    assert result.ret == 1, result.stdout.str()
    code, out = run_cli("gate", pytester.path / "j.xml")
    assert code == 1, out
    reason = reasons_under(out, "NEW error: target=cpu op=ox_op candidate=ox_raises")
    assert len(reason) == 1 and "array must not contain infs or NaNs" in reason[0], out


RIGHT_SCALE = """

@pytest_arbiter.candidate("rs_scale", target="cpu", name="rs_right")
def rs_right(x):
    return x * 2.0
"""


def test_a_rejection_found_while_tuning_names_the_test_it_was_found_in(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuning gate's rejection is counted once per run, outside any testcase's
    counts; the report still records the tests it was found in, so ``gate`` names them
    (GPU runners always tune: their reports are what the fleet gate reads)."""
    pytester.makeconftest(LSE_CONFTEST + RIGHT_SCALE)
    pytester.makepyfile(test_rs=LSE_TESTS)
    monkeypatch.setenv("RS_TUNE", "1")
    tune = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--arbiter-tune",
                                         "--arbiter-cache=c.json", "--junitxml=j.xml",
                                         "-k", "scale")
    assert tune.ret == 1, tune.stdout.str()
    code, out = run_cli("gate", pytester.path / "j.xml")
    assert code == 1, out
    line = next(x for x in out.splitlines() if x.startswith("NEW rejected"))
    assert "candidate=rs_wrong" in line and line.endswith("in test_rs.py::test_scale"), out
    assert read_report(pytester.path / "j.xml").tests[REJECTED] == {"test_rs.py::test_scale"}
