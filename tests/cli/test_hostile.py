"""Hostile and damaged artifacts.

The fleet gate fails closed: a damaged report or histogram is an error (exit 2, the
file named, no traceback), never a degrade gone; byte-mutated real artifacts prove it.
Hostile input (deep nesting, lone surrogates, numbers that overflow to infinity,
duplicate keys, byte order marks, non-UTF-8, XML entities) is a clear error in the CLI
and the plugin, and every name that came from a runner's file is printed escaped.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import subprocess
import sys
import typing
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating import histogram_file, junit
from pytest_arbiter.gating.histogram import OUTCOMES
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, MeasureCache, RankedCandidate
from pytest_arbiter.store.safetext import escape, line
from pytest_arbiter.timing.measure import LatencyStats


def gate(*argv: str | Path) -> tuple[int, str, str]:
    """``pytest-arbiter ARGV`` in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv], out=out)
    return code, out.getvalue(), err.getvalue()


def assert_clear_error(result: tuple[int, str, str], path: Path, *needles: str) -> None:
    code, out, err = result
    assert code == 2, (out, err)
    assert str(path) in err and "Traceback" not in err and "internal error" not in err, err
    assert "gate passed" not in out
    for needle in needles:
        assert needle in err, err


def assert_safe_output(text: str) -> None:
    """No control character but the line breaks, nothing a terminal or a CI log reads as
    a command."""
    for row in text.splitlines():
        assert row.isprintable(), repr(row)
        assert not row.lstrip().startswith(("::", "##")), repr(row)


# -- the escaping itself -------------------------------------------------------------------


def test_escape_leaves_printable_text_alone() -> None:
    for text in ("cutlass::gemm_16x8", "tests/test_a.py::test_b[1-x]", "é 数 ∑", "a\\nb"):
        assert escape(text) == text and line(text) == text


def test_escape_replaces_what_is_not_printable() -> None:
    hostile = "a\x1b[31mb\nc\rd\te\x85f\x9bg\u2028h\u202ei\u200bj\ud800k\U000e0001\xa0"
    assert escape(hostile) == (
        "a\\x1b[31mb\\nc\\rd\\te\\x85f\\x9bg\\u2028h\\u202ei\\u200bj\\ud800k\\U000e0001\\xa0")
    assert escape(escape(hostile)) == escape(hostile)


def test_line_defuses_ci_log_commands() -> None:
    assert line("::error file=a::pwned") == "\\x3a:error file=a::pwned"
    assert line("   ##[group]x") == "   \\x23#[group]x"
    assert line("##vso[task.setvariable]") == "\\x23#vso[task.setvariable]"
    assert line("\n::warning::x") == "\\n::warning::x"
    assert line("ns::kernel") == "ns::kernel"
    assert line(line("::x")) == line("::x")


# -- the histogram and baseline format -------------------------------------------------


def test_the_outcome_type_is_the_outcome_list() -> None:
    assert typing.get_args(histogram_file.Outcome) == OUTCOMES


def test_histogram_bytes_are_deterministic_and_the_format_kept(tmp_path: Path) -> None:
    counts = {("cpu", "matmul", "k", "degraded"): 3, ("cpu", "matmul", "blas", "won"): 5}
    path = tmp_path / "h.json"
    histogram_file.write_histogram(path, counts, {("cpu", "matmul", "k", "degraded"): 1})
    first = path.read_bytes()
    data = json.loads(first)
    assert list(data) == ["entries", "schema", "total", "version"]
    assert data["total"] == {"count": 8, "expected": 1}
    assert [list(e) for e in data["entries"]] == [
        ["count", "op", "outcome", "selected", "target"],
        ["count", "expected", "op", "outcome", "selected", "target"]]
    counts_read, expected = histogram_file.read_histogram_expected(path)
    histogram_file.write_histogram(path, counts_read, expected)
    assert path.read_bytes() == first
    # a baseline committed before the total existed (two-space indent, sorted keys)
    del data["total"]
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert histogram_file.read_histogram(path) == counts


def test_a_histogram_that_no_reader_would_accept_is_not_written(tmp_path: Path) -> None:
    for counts in ({("cpu", "", "k", "won"): 1}, {("cpu", "m", "k", "won"): -1},
                   {("cpu", "m", "k", "wonderful"): 1}, {("cpu", "m", "k\ud800", "won"): 1}):
        with pytest.raises(ArtifactError, match=r"cannot write .*h\.json"):
            histogram_file.write_histogram(tmp_path / "h.json", counts)
        assert not (tmp_path / "h.json").exists()


def _histogram_text(entry: str, tail: str = "") -> str:
    return ('{"entries": [' + entry + '], "schema": "pytest-arbiter/histogram", '
            '"version": 1' + tail + "}")


_ENTRY = '{"count": 2, "op": "m", "outcome": "degraded", "selected": "%s", "target": "cpu"}'
DEGRADE = _ENTRY % "k"

HOSTILE_JSON = {
    # name: (bytes, what the message says)
    "deep-object": (b'{"a":' * 2000 + b"1" + b"}" * 2000, ""),
    "deep-entries": (_histogram_text("[" * 2000 + "]" * 2000).encode(), "$.entries[0]"),
    "lone-surrogate": (_histogram_text(_ENTRY % "k\\ud800").encode(), "surrogate"),
    "overflow": (_histogram_text(DEGRADE.replace('"count": 2', '"count": 1e400')).encode(),
                 "$.entries[0].count"),
    "duplicate-key": (_histogram_text(DEGRADE, ', "entries": []').encode(),
                      'the key "entries" appears twice'),
    "duplicate-field": (_histogram_text(DEGRADE.replace("}", ', "count": 0}')).encode(),
                        'the key "count" appears twice'),
    "bom": (b"\xef\xbb\xbf" + _histogram_text(DEGRADE).encode(), "byte order mark"),
    "utf16": (_histogram_text(DEGRADE).encode("utf-16"), "byte order mark"),
    "not-utf8": (_histogram_text(_ENTRY % "k\xe9").encode("latin-1"), "UTF-8"),
    "unknown-field": (_histogram_text(DEGRADE.replace('"count"', '"bount"')).encode(),
                      "unknown field `bount` - at `$.entries[0]`"),
    "missing-field": (_histogram_text(DEGRADE.replace('"count": 2, ', "")).encode(),
                      "missing required field `count` - at `$.entries[0]`"),
    "nan": (_histogram_text(DEGRADE.replace('"count": 2', '"count": NaN')).encode(), ""),
    "expected-above-count": (_histogram_text(DEGRADE.replace("}", ', "expected": 3}'))
                             .encode(), "expected (3) is more than count (2)"),
    "total-mismatch": (_histogram_text(DEGRADE, ', "total": {"count": 3, "expected": 0}')
                       .encode(), "total says count 3"),
    "empty-name": (_histogram_text(_ENTRY % "").encode(), "$.entries[0].selected"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_a_hostile_histogram_is_a_clear_error_as_input_and_as_baseline(
        tmp_path: Path, name: str) -> None:
    data, needle = HOSTILE_JSON[name]
    hostile = tmp_path / f"{name}.json"
    hostile.write_bytes(data)
    good = tmp_path / "good.json"
    good.write_text(_histogram_text(DEGRADE))
    assert_clear_error(gate("gate", "--baseline", tmp_path / "none.json", good, hostile),
                       hostile, needle)
    assert_clear_error(gate("gate", "--baseline", hostile, good), hostile, needle)


@pytest.mark.parametrize("name", ["deep-object", "lone-surrogate", "overflow",
                                  "duplicate-key", "bom", "not-utf8"])
@pytest.mark.parametrize("command", ["show", "diff", "merge"])
def test_a_hostile_cache_is_a_clear_error(tmp_path: Path, name: str, command: str) -> None:
    data, _ = HOSTILE_JSON[name]
    if name in ("lone-surrogate", "overflow", "duplicate-key"):
        data = (b'{"schema": "pytest-arbiter/cache", "version": 2, "entries": [], '
                b'"runs": [], "x": ' + {"lone-surrogate": b'"\\udc00"', "overflow": b"1e400",
                                        "duplicate-key": b'1, "entries": []'}[name] + b"}")
    hostile = tmp_path / "hostile.json"
    hostile.write_bytes(data)
    good = tmp_path / "good.json"
    artifacts.write_cache(good, MeasureCache())
    argv = {"show": ["show", hostile], "diff": ["diff", good, hostile],
            "merge": ["merge", "-o", good, hostile]}[command]
    before = good.read_bytes()
    assert_clear_error(gate(*argv), hostile)
    assert good.read_bytes() == before


def test_parse_json_refuses_what_json_loads_accepts() -> None:
    # nesting is refused past MAX_DEPTH on every Python: 200 levels is within 3.11's
    # recursion limit, and 3.13's parsers take 3000 without a RecursionError
    for text in ('{"a": 1, "a": 2}', "[1e400]", "[-1e400]", '["\\ud800"]', "NaN",
                 "[" * 3000 + "]" * 3000, "[" * 200 + "]" * 200, '{"a":' * 200 + "1" + "}" * 200):
        with pytest.raises(ArtifactError, match="src"):
            artifacts.parse_json(text, "src")


# -- JUnit XML: parsed safely ----------------------------------------------------------------


def suite_xml(cases: str, totals: dict[str, int], marker: bool = True) -> str:
    """A report as the plugin writes it: the suite properties, then the testcases."""
    props = "".join(f'<property name="arbiter-total:{k}" value="{v}"/>'
                    for k, v in totals.items())
    head = '<property name="arbiter-report" value="1"/>' if marker else ""
    return (f'<testsuites><testsuite name="pytest"><properties>{head}{props}</properties>'
            f"{cases}</testsuite></testsuites>")


def case_xml(name: str, **props: int) -> str:
    inner = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props.items())
    return f'<testcase classname="t" name="{name}"><properties>{inner}</properties></testcase>'


@pytest.fixture(params=["stdlib", "lxml"])
def xml_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with junitparser on each XML backend (lxml where installed)."""
    import junitparser.junitparser as backend

    if request.param == "lxml":
        monkeypatch.setattr(backend, "etree", pytest.importorskip("lxml.etree"))
    else:
        monkeypatch.setattr(backend, "etree", ET)
    return str(request.param)


@pytest.mark.parametrize("prolog_check", [True, False])
def test_a_report_with_a_local_dtd_entity_leaks_nothing(
        tmp_path: Path, xml_backend: str, prolog_check: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-TOKEN-42")
    # an external DTD beside the report (a runner uploads both) turns the file into an
    # internal entity, which an attribute may then use
    (tmp_path / "evil.dtd").write_text(
        f'<!ENTITY % file SYSTEM "file://{secret}">\n'
        "<!ENTITY % wrap \"<!ENTITY leak '%file;'>\">\n%wrap;\n")
    report = tmp_path / "report.xml"
    report.write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<!DOCTYPE testsuites [\n<!ENTITY % ext SYSTEM "evil.dtd">\n%ext;\n'
        f'<!ENTITY inner "::error::pwned">\n<!ENTITY direct SYSTEM "file://{secret}">\n]>\n'
        + suite_xml(case_xml("x &leak; &inner;",
                             **{"arbiter:cpu/matmul/k/degraded": 1}) + "<x>&direct;</x>",
                    {"cpu/matmul/k/degraded": 1}))
    if not prolog_check:  # the parser's own configuration must hold on its own
        monkeypatch.setattr(junit, "_check_prolog", lambda text, source: None)
    code, out, err = gate("gate", "--baseline", tmp_path / "none.json", report)
    assert_clear_error((code, out, err), report)
    assert "TOP-SECRET" not in out + err and "pwned" not in out + err


def test_an_internal_entity_is_refused(tmp_path: Path, xml_backend: str) -> None:
    report = tmp_path / "report.xml"
    report.write_text('<!DOCTYPE testsuites [<!ENTITY e "::error::pwned">]>' + suite_xml(
        case_xml("x&e;", **{"arbiter:cpu/matmul/k/degraded": 1}),
        {"cpu/matmul/k/degraded": 1}))
    code, out, err = gate("gate", "--baseline", tmp_path / "none.json", report)
    assert_clear_error((code, out, err), report, "document type")
    assert "pwned" not in out


@pytest.mark.parametrize(("data", "needle"), [
    (b"\xef\xbb\xbf" + suite_xml("", {}).encode(), "byte order mark"),
    (suite_xml(case_xml("x\xe9"), {}).encode("latin-1"), "is not UTF-8"),
    (b'<?xml version="1.0" encoding="latin-1"?>' + suite_xml("", {}).encode(),
     "declares the encoding 'latin-1'"),
    (suite_xml("", {}).encode("utf-16"), "byte order mark"),
])
def test_a_report_in_another_encoding_is_refused(tmp_path: Path, xml_backend: str,
                                                 data: bytes, needle: str) -> None:
    report = tmp_path / "report.xml"
    report.write_bytes(data)
    assert_clear_error(gate("gate", "--baseline", tmp_path / "none.json", report), report,
                       needle)


# -- names from runners' files are printed escaped -----------------------------------------

EVIL = "k\n::error file=ci.yml::pwned\x1b[2J\u2028##[group]x"


def test_gate_escapes_names_from_a_histogram(tmp_path: Path) -> None:
    hostile = tmp_path / "h.json"
    histogram_file.write_histogram(hostile, {("cpu", "::op", EVIL, "degraded"): 2})
    baseline = tmp_path / "base.json"
    histogram_file.write_histogram(baseline, {("cpu", "::op", EVIL, "error"): 1,
                                         ("cpu", "other", EVIL, "degraded"): 1})
    code, out, err = gate("gate", "--baseline", baseline, hostile)
    assert code == 1 and "NEW degraded: target=cpu op=::op candidate=k\\n::error" in out
    assert "fixed error" in out and "unchecked degraded" in out
    assert_safe_output(out + err)


def test_gate_escapes_names_from_a_junit_report(tmp_path: Path) -> None:
    # XML can carry a line break (&#10;) and C1 controls (&#x9b; is CSI) in attributes
    key = "cpu/m/k&#10;::error::pwned&#x9b;2J/degraded"
    report = tmp_path / "report.xml"
    report.write_text(suite_xml(case_xml("t&#10;::warning::x", **{f"arbiter:{key}": 1}),
                                {key: 1}))
    code, out, err = gate("gate", "--baseline", tmp_path / "none.json", report)
    assert code == 1 and "candidate=k\\n::error::pwned\\x9b2J" in out, out + err
    assert "in t::t\\n::warning::x" in out
    assert_safe_output(out + err)


def test_error_messages_are_escaped(tmp_path: Path) -> None:
    hostile = tmp_path / "h.json"
    hostile.write_text(_histogram_text(DEGRADE.replace(
        '"count"', '"\\u001b[31m\\n::error::x"')))
    code, out, err = gate("gate", "--baseline", tmp_path / "none.json", hostile)
    assert code == 2 and "unknown field" in err
    assert_safe_output(out + err)


def _cache_entry(bucket: str, *names: str, device: str = "sm_90", host: str = "h"
                 ) -> CacheEntry:
    ranking = tuple(RankedCandidate(n, LatencyStats(m, m, m, m, m, 25))
                    for n, m in zip(names, (1000.0, 1500.0), strict=False))
    return CacheEntry(device, "nvidia", "matmul", bucket, "float16", ranking, 0.999, False,
                      {}, {"host": host, "measured_at": "2026-12-03T06:00:00Z"})


def test_show_diff_and_merge_escape_names_from_caches(tmp_path: Path) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    artifacts.write_cache(old, MeasureCache([
        _cache_entry("k", EVIL, "w\u202ex", device="::error::dev", host="\x1b[31mh"),
        _cache_entry("gone\n::x", "y")]))
    artifacts.write_cache(new, MeasureCache([
        _cache_entry("k", "w\u202ex", EVIL, device="::error::dev", host="##[h]"),
        _cache_entry("added\r::x", EVIL)]))
    texts = []
    for argv in (["show", "--wide", old], ["show", "--wide", new], ["diff", old, new],
                 ["merge", "-o", tmp_path / "out.json", old, new]):
        code, out, err = gate(*argv)
        assert code == 0, err
        texts.append(out + err)
    assert "\\x3a:error::dev" in texts[0] and "k\\n::error file=ci.yml" in texts[0]
    assert "changed " in texts[2] and "added " in texts[2] and "removed " in texts[2]
    assert "conflict " in texts[3]
    for text in texts:
        assert_safe_output(text)


def test_an_unexpected_error_is_exit_2_not_a_verdict(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    import pytest_arbiter.cli.main as cli

    def broken(args: object, out: object) -> int:
        raise RuntimeError("boom\n::error::x")

    monkeypatch.setattr(cli, "cmd_gate", broken)
    code, _, err = gate("gate", "--baseline", tmp_path / "b.json", tmp_path / "r.xml")
    assert code == 2 and "internal error: RuntimeError: boom\\n::error::x" in err
    assert_safe_output(err)


# -- the plugin ------------------------------------------------------------------------------

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
    assert_clear_error(gate("gate", "--baseline", pytester.path / "b.json", report), report,
                       "the run's dispatch counts are incomplete (worker gw")


# -- the fleet gate fails closed: real reports, damaged --------------------------------------

FLEET_CONFTEST = """
import pytest_arbiter

pytest_arbiter.op("fz_mm", reference=lambda a, b: a @ b)
pytest_arbiter.op("fz_known_op", reference=lambda a, b: a @ b)


@pytest_arbiter.candidate("fz_mm", target="cpu", name="fz_declining", tier=9)
def declining(a, b):
    raise pytest_arbiter.Decline("not yet")


@pytest_arbiter.candidate("fz_known_op", target="cpu", name="known_slow", tier=9)
def known(a, b):
    raise pytest_arbiter.Decline("known")
"""

FLEET_TESTS = """
import numpy as np
import pytest
import pytest_arbiter

A = np.ones((4, 3), np.float32)
B = np.ones((3, 2), np.float32)
pytest_arbiter.dispatch("softmax", np.ones((2, 5), np.float32))  # outside any test


def test_degrade(arbiter):
    arbiter.dispatch("fz_mm", A, B)


@pytest.mark.arbiter_expect_degrade
def test_on_purpose(arbiter):
    arbiter.dispatch("fz_mm", A, B)


def test_known(arbiter):
    arbiter.dispatch("fz_known_op", A, B)


def test_softmax(arbiter):
    arbiter.dispatch("softmax", np.ones((2, 5), np.float32))
"""

NEW_DEGRADE = "NEW degraded: target=cpu op=fz_mm candidate=fz_declining (1 dispatches)"
NEW_LINE = f"{NEW_DEGRADE} in test_one::test_degrade"
KNOWN = ("cpu", "fz_known_op", "known_slow", "degraded")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real artifacts of a run that records one new degrade (once, in one test), one
    degrade on purpose of the same key, one known degrade, wins in and outside tests:
    a JUnit report (xunit2), one from xdist workers (xunit1), the histogram, and a
    baseline listing the known degrade."""
    pytest.importorskip("xdist")
    root = tmp_path_factory.mktemp("fleet")
    (root / "conftest.py").write_text(FLEET_CONFTEST)
    (root / "test_one.py").write_text(FLEET_TESTS)
    (root / "pytest.ini").write_text("[pytest]\n")
    common = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    for extra in (["-o", "junit_family=xunit2", "--junitxml=xunit2.xml",
                   "--arbiter-histogram=histogram.json"],
                  ["-n", "2", "-p", "no:benchmark", "-o", "junit_family=xunit1",
                   "--junitxml=xunit1-xdist.xml"]):
        proc = subprocess.run([*common, *extra], cwd=root, capture_output=True, text=True,
                              timeout=300)
        assert "fz_declining" in proc.stdout, proc.stdout + proc.stderr
    histogram_file.write_histogram(root / "baseline.json", {KNOWN: 1})
    return root


@pytest.mark.xdist
def test_the_plugin_writes_the_run_totals_into_the_junit_report(fleet: Path) -> None:
    counts = histogram_file.read_histogram(fleet / "histogram.json")
    for report in ("xunit2.xml", "xunit1-xdist.xml"):
        suite = ET.parse(fleet / report).getroot().find("testsuite")
        assert suite is not None
        props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
        assert props.pop("arbiter-report") == "1"
        totals = {k: int(v or 0) for k, v in props.items() if k.startswith("arbiter-total:")}
        outside = {k: int(v or 0) for k, v in props.items()
                   if k.startswith("arbiter-outside:")}
        evidence = {k for k in props
                    if k.startswith(("arbiter-checked:", "arbiter-registered:"))}
        assert evidence, "the run's evidence of its candidates (what proves a fix)"
        assert set(props) == set(totals) | set(outside) | evidence
        # the import-time dispatch: once per process that imported the test module
        processes = 2 if "xdist" in report else 1
        assert outside == {"arbiter-outside:cpu/softmax/inplace_softmax/won": processes}
        if processes == 1:
            assert totals == {junit.property_name(k, junit.TOTAL_PREFIX): v
                              for k, v in counts.items()}
        code, out, _ = gate("gate", "--baseline", fleet / "baseline.json", fleet / report)
        assert code == 1 and NEW_LINE in out
        assert "known degraded: target=cpu op=fz_known_op candidate=known_slow" in out


def _edit(report: Path, old: str, new: str, count: int = 1) -> Path:
    text = report.read_text()
    assert text.count(old) >= count, old
    out = report.with_name("edited.xml")
    out.write_text(text.replace(old, new, count))
    return out


@pytest.mark.parametrize(("old", "new", "needle"), [
    # a testcase property no longer read (the fleet gate passed on this before)
    ('<property name="arbiter:cpu/fz_mm', '<qroperty name="arbiter:cpu/fz_mm',
     "the testcases record 1 dispatches and 0 were outside any test, but the suite total "
     "is 2"),
    ('name="arbiter:cpu/fz_mm', 'nbme="arbiter:cpu/fz_mm', "a <property> without a name"),
    ('name="arbiter:cpu/fz_mm', 'name="arbiter-cpu/fz_mm', "unknown testcase property"),
    ('name="arbiter:cpu/fz_mm', 'name="arbiter;cpu/fz_mm', "suite total is 2"),
    ('name="arbiter:cpu/fz_mm', 'name="crbiter:cpu/fz_mm', "suite total is 2"),
    ('name="arbiter-total:cpu/fz_mm/fz_declining/degraded" value="2"',
     'name="arbiter-total:cpu/fz_mm/fz_declining/degraded" value="3"', "suite total is 3"),
    ('name="arbiter-total:cpu/fz_mm', 'name="arbiter-total:cpu/fz_ml', "fz_ml"),
    ('<property name="arbiter-report" value="1"', '<qroperty name="arbiter-report" value="1"',
     "no 'arbiter-report' suite property"),
    ('name="arbiter-report" value="1"', 'name="arbiter-report" value="3"', "reads version 1"),
    ('name="arbiter-report" value="1"', 'name="arbiter-reporu" value="1"',
     "unknown suite property"),
    ('name="arbiter-report" value="1" />',
     'name="arbiter-report" value="1" /><property name="arbiter-incomplete" '
     'value="worker gw1 crashed" />', "incomplete (worker gw1 crashed)"),
    ('name="arbiter-expect-degrade" value="1"', 'name="arbiter-expect-degrade" value="2"',
     "not '1'"),
    ('<property name="arbiter:cpu/fz_mm/fz_declining/degraded" value="1"',
     '<property name="arbiter:cpu/fz_mm/fz_declining/degraded" value="01"',
     "not a positive count"),
    ('<property name="arbiter:cpu/fz_mm/fz_declining/degraded" value="1"',
     '<property name="arbiter:cpu/fz_mm/fz_declining/degraded" value=" 1"',
     "not a positive count"),
])
@pytest.mark.xdist
def test_a_damaged_report_is_refused(fleet: Path, old: str, new: str, needle: str) -> None:
    edited = _edit(fleet / "xunit2.xml", old, new)
    assert_clear_error(gate("gate", "--baseline", fleet / "baseline.json", edited), edited,
                       needle)


@pytest.mark.xdist
def test_a_report_of_an_older_plugin_is_refused(fleet: Path) -> None:
    tree = ET.parse(fleet / "xunit2.xml")
    suite = tree.getroot().find("testsuite")
    assert suite is not None
    props = suite.find("properties")
    assert props is not None
    suite.remove(props)
    tree.write(fleet / "older.xml")
    assert_clear_error(gate("gate", "--baseline", fleet / "baseline.json", fleet / "older.xml"),
                       fleet / "older.xml", "no 'arbiter-report' suite property")


def mutants(data: bytes, flips: int, seed: int = 1) -> Iterator[tuple[str, bytes]]:
    """Every truncation and every one-byte deletion of ``data``, and ``flips`` one-bit
    flips of each byte (all eight when ``flips`` is 8; else a seeded choice)."""
    rng = random.Random(seed)
    for at in range(len(data)):
        yield f"truncated at {at}", data[:at]
        yield f"byte {at} deleted", data[:at] + data[at + 1:]
        bits = range(8) if flips >= 8 else rng.sample(range(8), flips)
        for bit in bits:
            flipped = bytes([data[at] ^ (1 << bit)])
            yield f"byte {at} bit {bit} flipped", data[:at] + flipped + data[at + 1:]


@pytest.mark.parametrize("artifact", ["xunit2.xml", "xunit1-xdist.xml", "histogram.json",
                                      "baseline.json"])
@pytest.mark.xdist
def test_no_damaged_artifact_removes_a_degrade(fleet: Path, tmp_path: Path,
                                               artifact: str) -> None:
    """Each mutant exits 2 naming the file with no traceback, or exits 1 still reporting
    a new degrade; none exits 0 (the unmutated artifact exits 1). ARBITER_FUZZ_FULL=1
    flips every bit of every byte (~4x the mutants)."""
    flips = 8 if os.environ.get("ARBITER_FUZZ_FULL") else 2
    original = fleet / artifact
    mutant = tmp_path / ("mutant" + original.suffix)
    baseline = fleet / "baseline.json"
    outcomes: dict[str, int] = {}
    wrong: list[str] = []
    for label, data in mutants(original.read_bytes(), flips):
        mutant.write_bytes(data)
        if artifact == "baseline.json":
            code, out, err = gate("gate", "--baseline", mutant, fleet / "xunit2.xml")
        else:
            code, out, err = gate("gate", "--baseline", baseline, mutant)
        if code == 2:
            kind = "refused"
            ok = str(mutant) in err and "Traceback" not in err and "gate passed" not in out
        elif code == 1:
            kind = "same degrade" if NEW_DEGRADE in out else "a degrade"
            ok = "NEW degraded: " in out and "degrade gate FAILED" in out
        else:
            kind, ok = f"exit {code}", False
        outcomes[kind] = outcomes.get(kind, 0) + 1
        if not ok:
            wrong.append(f"{label}: exit {code}\n{out}{err}")
    print(f"{artifact}: {sum(outcomes.values())} mutants: {outcomes}")
    assert not wrong, f"{len(wrong)} mutants: " + "\n".join(wrong[:5])
    assert outcomes.get("refused", 0) > outcomes.get("same degrade", 0) > 0


def test_non_utf8_is_a_clear_error_whichever_msgspec_reads_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """msgspec before 0.19 lets the codec's ``UnicodeDecodeError`` (a ``ValueError``)
    through where later versions raise a ``DecodeError``: both name the file."""
    from types import SimpleNamespace

    import msgspec

    from pytest_arbiter.store import strictjson

    def old_decode(data: bytes, **_: object) -> object:
        bytes(data).decode("utf-8")  # what msgspec 0.18 does with a bad string
        return msgspec.json.decode(data)

    class OldDecoder:
        def decode(self, data: bytes) -> object:
            return old_decode(data)

    monkeypatch.setattr(strictjson, "msgspec", SimpleNamespace(
        json=SimpleNamespace(decode=old_decode), ValidationError=msgspec.ValidationError,
        DecodeError=msgspec.DecodeError))
    monkeypatch.setattr(histogram_file, "_HEADER_DECODER", OldDecoder())
    path = tmp_path / "h.json"
    path.write_bytes(b'{"schema": "pytest-arbiter/histogram", "version": 1, "entries": '
                     b'[{"target": "cpu\xe9"}]}')
    with pytest.raises(ArtifactError, match=(
            rf"^{path} is not valid JSON: Invalid UTF-8 encoded string at line 1, "
            r"column 81 \(byte 80\)$")):
        histogram_file.read_histogram(path)
