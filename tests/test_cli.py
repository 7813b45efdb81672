"""The pytest-arbiter CLI on real files: show, merge, diff, and the fleet gate on JUnit
reports that pytest wrote (xunit2, with and without xdist)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_arbiter import artifacts
from pytest_arbiter.cache import CacheEntry, MeasureCache, RankedCandidate
from pytest_arbiter.cli import main
from pytest_arbiter.junit import case_id, parse_property, read_junit
from pytest_arbiter.measure import LatencyStats

DECLINING_CONFTEST = """
import pytest_arbiter

pytest_arbiter.op("cli_mm", reference=lambda a, b: a @ b)

# the only candidate of its op, so its decline runs the reference: a degrade
@pytest_arbiter.candidate("cli_mm", target="cpu", name="cli_declining", tier=9)
def k(a, b):
    raise pytest_arbiter.Decline("not yet")
"""

TESTS = """
import numpy as np
import pytest

A = np.ones((4, 3), np.float32)
B = np.ones((3, 2), np.float32)

@pytest.mark.parametrize("i", range(3))
def test_dispatch(arbiter, i):
    arbiter.dispatch("cli_mm", A, B)

def test_softmax(arbiter):
    arbiter.dispatch("softmax", np.ones((2, 5), np.float32))

def test_plain():
    pass
"""


def run(*argv: str | Path) -> tuple[int, str]:
    out = io.StringIO()
    code = main([str(a) for a in argv], out=out)
    return code, out.getvalue()


def suite_totals(*totals: tuple[str, int]) -> str:
    """The suite properties the plugin writes (docs/artifacts.md), for hand-made reports."""
    props = "".join(f"<property name='arbiter-total:{key}' value='{count}'/>"
                    for key, count in totals)
    return f"<properties><property name='arbiter-report' value='1'/>{props}</properties>"


def stats(median: float, samples: int = 25) -> LatencyStats:
    return LatencyStats(median, median * 0.9, median * 0.95, median * 1.05, median * 1.2,
                        samples)


def entry(bucket: str, *names: str, host: str = "h1", confidence: float = 0.999,
          medians: tuple[float, ...] = (1000.0, 1500.0, 2000.0)) -> CacheEntry:
    ranking = tuple(RankedCandidate(n, stats(m)) for n, m in zip(names, medians, strict=False))
    return CacheEntry("sm_90", "nvidia", "matmul", bucket, "float16", ranking, confidence,
                      False, {}, {"host": host, "measured_at": "2026-12-03T06:00:00Z"})


# -- show, merge, diff --------------------------------------------------------------------


def test_show_prints_a_table_and_json(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([entry("m64", "wmma", "cublas"),
                                              entry("m32", "cublas")]))
    code, text = run("show", path)
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split()[:6] == ["device", "target", "op", "bucket", "dtype", "winner"]
    assert "wmma" in lines[2] and "cublas +50.0%" in lines[2] and "1 us" in lines[2]
    assert lines[-1] == "2 entries on 1 devices (sm_90)"
    code, text = run("show", "--json", path)
    data = json.loads(text)
    assert code == 0 and [d["winner"] for d in data] == ["cublas", "wmma"]
    assert data[1]["ranking"][1] == {"name": "cublas", **stats(1500.0).to_dict()}


def test_show_json_is_the_to_dict_form_byte_for_byte(tmp_path: Path) -> None:
    """``show --json`` is made by msgspec, chunk by chunk; its text is still exactly what
    ``json.dump(indent=2, sort_keys=True)`` of :meth:`CacheEntry.to_dict` gives: numbers
    Python writes otherwise (``1e-05``, ``1e+16``), names past ASCII, DEL and control
    characters escaped, ``since`` only when known. Through a real stdout too."""
    import datetime

    from pytest_arbiter import cache_json

    odd = CacheEntry(
        "dev\x1b[31m\u2028\u00e9\U0001f600\x7f", "cpu", "op\n::error::x", 'b"\\', "float32",
        (RankedCandidate("k\u202e", LatencyStats(1e-5, 1.5e16, 0.5, 2.5e-7, 1e300, 3)),
         RankedCandidate("z", LatencyStats(3, 3, 3, 3, 3, 1))),
        0.5, True, {"x\u00ff": "why\n::warning"},
        {"host": "h\t", "p_value": 1.2e-05, "shapes": [[], [1, 2]],
         "measured_at": "2026-12-03T06:00:00Z", "versions": {"numpy": "2.1"}, "rounds": 7},
        {"k\u202e": {"fingerprint": "f" * 16, "outcome": "timed"},
         "q": {"fingerprint": "0e12", "outcome": "rejected", "reason": "err 1e-3"}},
        {"device_name": "\u00dc"}, True,
        datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
    plain = [entry(f"m{i}", "wmma", "cublas", medians=(1000.5 + i, 1e-5 * i))
             for i in range(30)]
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([odd, *plain]))
    entries = artifacts.read_cache(path).entries()
    expected = json.dumps([e.to_dict() for e in entries], indent=2, sort_keys=True,
                          allow_nan=False) + "\n"
    assert expected.isascii() and "1e-05" in expected and "1e+300" in expected
    code, text = run("show", "--json", path)
    assert code == 0 and text == expected
    assert run("show", "--json", "--op", "none", path) == (0, "[]\n")
    for per_chunk in (1, 7):  # the joints between chunks
        cache_json.ENTRIES_PER_CHUNK, was = per_chunk, cache_json.ENTRIES_PER_CHUNK
        try:
            assert run("show", "--json", path)[1] == expected
        finally:
            cache_json.ENTRIES_PER_CHUNK = was
    proc = subprocess.run([sys.executable, "-m", "pytest_arbiter.cli", "show", "--json",
                           str(path)], capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.decode("ascii") == expected


def test_merge_into_a_corpus_that_is_also_an_input(tmp_path: Path) -> None:
    corpus, a, b = tmp_path / "corpus.json", tmp_path / "a.json", tmp_path / "b.json"
    artifacts.write_cache(corpus, MeasureCache([entry("old", "x")]))
    artifacts.write_cache(a, MeasureCache([entry("k", "wmma", "cublas", host="ra"),
                                           entry("ka", "x")]))
    artifacts.write_cache(b, MeasureCache([entry("k", "cublas", "wmma", host="rb",
                                                 confidence=0.9995),
                                           entry("kb", "x")]))
    code, text = run("merge", "-o", corpus, corpus, a, b)
    assert code == 0, text
    assert "conflict sm_90/nvidia/matmul/k/float16: kept cublas (host rb" in text
    assert "4 entries after merging 3 shard(s); 1 conflict(s)" in text
    merged = artifacts.read_cache(corpus)
    assert {e.bucket: e.winner for e in merged.entries()} == {
        "old": "x", "k": "cublas", "ka": "x", "kb": "x"}
    # merging the same shards again changes nothing (idempotent), byte for byte
    before = corpus.read_bytes()
    assert run("merge", "-o", corpus, b, a)[0] == 0
    assert corpus.read_bytes() == before
    assert run("merge", "--fail-on-conflict", "-o", corpus, a, b)[0] == 1


def test_merge_refuses_a_bad_shard_and_leaves_out_untouched(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    corpus, bad = tmp_path / "corpus.json", tmp_path / "bad.json"
    artifacts.write_cache(corpus, MeasureCache([entry("old", "x")]))
    before = corpus.read_bytes()
    bad.write_text('{"schema": "pytest-arbiter/cache", "version": 1, "entries": [')
    assert run("merge", "-o", corpus, bad)[0] == 2
    assert "bad.json is not valid JSON" in capsys.readouterr().err
    assert run("merge", "-o", corpus, tmp_path / "missing.json")[0] == 2
    assert corpus.read_bytes() == before
    corpus.write_bytes(before[:40])
    assert run("merge", "-o", corpus, corpus)[0] == 2
    assert corpus.read_bytes() == before[:40]


def test_diff_names_changed_winners_and_by_how_much(tmp_path: Path) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    artifacts.write_cache(old, MeasureCache([entry("k", "wmma", "cublas"), entry("gone", "x")]))
    artifacts.write_cache(new, MeasureCache([
        entry("k", "cublas", "wmma", medians=(800.0, 1200.0)), entry("added", "x")]))
    code, text = run("diff", old, new)
    assert code == 0
    assert ("changed sm_90/nvidia/matmul/k/float16: wmma (1 us) -> cublas (800 ns, -20.0%); "
            "wmma now +50.0% slower") in text
    assert "added sm_90/nvidia/matmul/added/float16: x" in text
    assert "removed sm_90/nvidia/matmul/gone/float16: x" in text
    assert text.endswith("1 winners changed, 1 keys added, 1 removed, 0 unchanged\n")


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run()[0] == 2
    assert run("gate", "report.xml")[0] == 2  # --baseline is required
    assert "--baseline" in capsys.readouterr().err
    assert run("frobnicate")[0] == 2
    assert run("--help")[0] == 0
    assert "exit codes: 0 pass, 1 gate failed, 2 usage error" in capsys.readouterr().out


# -- the gate on real reports -------------------------------------------------------------


@pytest.fixture(scope="module")
def built_reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JUnit reports pytest wrote for one small project (xunit2): a plain run with its
    histogram, and an xdist run that also wrote the baseline. Built once per module."""
    pytest.importorskip("xdist")
    root = tmp_path_factory.mktemp("reports")
    (root / "conftest.py").write_text(DECLINING_CONFTEST)
    (root / "test_one.py").write_text(TESTS)
    (root / "pytest.ini").write_text("[pytest]\n")
    common = [sys.executable, "-m", "pytest", "-q", "-o", "junit_family=xunit2",
              "-p", "no:cacheprovider"]
    runs = [["--junitxml=plain.xml", "--arbiter-histogram=hist.json"],
            # pytest-benchmark warns that xdist disables it
            ["-n", "2", "-p", "no:benchmark", "--junitxml=xdist.xml",
             "--arbiter-write-baseline=base.json"]]
    for extra in runs:
        proc = subprocess.run([*common, *extra], cwd=root, capture_output=True, text=True,
                              timeout=300)
        assert "cli_declining" in proc.stdout, proc.stdout + proc.stderr
    return root


@pytest.fixture
def reports(built_reports: Path, tmp_path: Path) -> Path:
    """A private copy of the built reports (tests may rewrite the baseline)."""
    return Path(shutil.copytree(built_reports, tmp_path / "reports"))


def test_gate_fails_on_a_new_degrade_naming_it_and_its_tests(reports: Path) -> None:
    code, text = run("gate", "--baseline", reports / "none.json", reports / "plain.xml")
    assert code == 1, text
    assert "none.json does not exist yet: it counts as empty" in text
    assert ("NEW degraded: target=cpu op=cli_mm candidate=cli_declining (3 dispatches) in "
            "test_one::test_dispatch[0], test_one::test_dispatch[1], "
            "test_one::test_dispatch[2]") in text
    assert "degrade gate FAILED: 1 new degraded, rejected or error entries" in text
    assert "softmax" not in text.split("NEW")[1]  # won dispatches are not gated


def test_gate_passes_on_a_known_degrade(reports: Path) -> None:
    for report in ("plain.xml", "xdist.xml", "hist.json"):
        code, text = run("gate", "--baseline", reports / "base.json", reports / report)
        assert code == 0, text
        assert "known degraded: target=cpu op=cli_mm candidate=cli_declining" in text
        assert "degrade gate passed (1 known gated entries)" in text


def test_xdist_and_test_order_do_not_change_the_verdict(reports: Path) -> None:
    plain = run("gate", "--baseline", reports / "none.json", reports / "plain.xml")
    xdist = run("gate", "--baseline", reports / "none.json", reports / "xdist.xml")
    assert plain[0] == xdist[0] == 1
    assert plain[1].splitlines()[1:] == xdist[1].splitlines()[1:]
    # reversed testcase order and loadgroup's @group suffixes: the same verdict
    tree = ET.parse(reports / "plain.xml")
    for suite in tree.getroot().iter("testsuite"):
        cases = list(suite.iter("testcase"))
        for case in cases:
            suite.remove(case)
            case.set("name", case.get("name", "") + "@grp")
        suite.extend(reversed(cases))
    tree.write(reports / "shuffled.xml")
    assert "@grp" in (reports / "shuffled.xml").read_text()
    again = run("gate", "--baseline", reports / "none.json", reports / "shuffled.xml")
    assert again[0] == 1 and again[1].splitlines()[1:] == plain[1].splitlines()[1:]


def test_gate_merges_runners_and_reports_fixed_and_unchecked(reports: Path) -> None:
    baseline = reports / "base.json"
    counts = artifacts.read_histogram(baseline)
    counts[("cpu", "cli_mm", "retired_kernel", "degraded")] = 2
    counts[("nvidia", "matmul", "wmma", "degraded")] = 1
    artifacts.write_histogram(baseline, counts)
    code, text = run("gate", "--baseline", baseline, reports / "plain.xml",
                     reports / "xdist.xml")
    assert code == 0, text
    assert "read 2 report(s), 10 testcase(s)" in text
    assert "known degraded: target=cpu op=cli_mm candidate=cli_declining (6 dispatches" in text
    assert "fixed degraded: target=cpu op=cli_mm candidate=retired_kernel" in text
    assert "unchecked degraded: target=nvidia op=matmul candidate=wmma" in text
    code, text = run("gate", "--update", "--baseline", baseline, reports / "plain.xml")
    assert code == 0 and "1 fixed entries removed" in text
    kept = artifacts.read_histogram(baseline)
    assert ("cpu", "cli_mm", "retired_kernel", "degraded") not in kept
    assert ("nvidia", "matmul", "wmma", "degraded") in kept
    assert ("cpu", "cli_mm", "cli_declining", "degraded") in kept


@pytest.mark.parametrize(("name", "content", "message"), [
    ("broken.xml", "<testsuites><testsuite><testcase name='x'>", "is not valid JUnit XML"),
    ("other.xml", "<html><body/></html>", "is not valid JUnit XML: Invalid format"),
    ("broken.json", '{"schema": "pytest-arbiter/histogram", "version": 1, "entr',
     "is not valid JSON"),
    ("wrong.json", '{"schema": "something-else"}', "schema is 'something-else'"),
    ("empty.xml", "", "neither JUnit XML nor"),
    ("badprop.xml", "<testsuites><testsuite><testcase classname='t' name='x'><properties>"
     "<property name='arbiter:cpu/matmul/k/degraded' value='lots'/></properties></testcase>"
     "</testsuite></testsuites>",
     "test t::x: property 'arbiter:cpu/matmul/k/degraded' has the value 'lots', not a "
     "positive count"),
])
def test_gate_exits_2_on_an_unreadable_input(reports: Path, name: str, content: str,
                                            message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (reports / name).write_text(content)
    code, text = run("gate", "--baseline", reports / "base.json", reports / "plain.xml",
                     reports / name)
    assert code == 2 and "degrade gate passed" not in text
    assert message in capsys.readouterr().err


def test_gate_exits_2_on_a_missing_input_or_bad_baseline(reports: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert run("gate", "--baseline", reports / "base.json", reports / "nope.xml")[0] == 2
    assert "nope.xml" in capsys.readouterr().err
    (reports / "bad-base.json").write_text("[1, 2")
    assert run("gate", "--baseline", reports / "bad-base.json", reports / "plain.xml")[0] == 2


def test_gate_warns_when_reports_hold_no_arbiter_data(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text("<testsuites><testsuite name='s'><testcase classname='t' name='x'/>"
                      "</testsuite></testsuites>")
    code, text = run("gate", "--baseline", tmp_path / "b.json", report)
    assert code == 0 and "hold no pytest-arbiter dispatch data" in text


def test_junit_helpers() -> None:
    assert case_id("pkg.test_a.TestK", "test_b[1-x]@gpu") == "pkg.test_a.TestK::test_b[1-x]"
    assert case_id("m", "test_b[a@b]") == "m::test_b[a@b]"
    assert parse_property("arbiter:cpu/matmul/ns/kern/won") == ("cpu", "matmul", "ns/kern", "won")
    assert parse_property("other") is None
    with pytest.raises(ValueError, match="unknown outcome 'meh'"):
        parse_property("arbiter:cpu/matmul/k/meh")


def test_a_bare_testsuite_root_is_read(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        f"<testsuite name='s'>{suite_totals(('cpu/matmul/k/degraded', 2))}"
        "<testcase classname='t' name='x@g'><properties>"
        "<property name='arbiter:cpu/matmul/k/degraded' value='2'/></properties></testcase>"
        "</testsuite>")
    fleet = read_junit(report)
    assert fleet.counts == {("cpu", "matmul", "k", "degraded"): 2}
    assert fleet.tests == {("cpu", "matmul", "k", "degraded"): {"t::x"}}
    code, text = run("gate", "--baseline", tmp_path / "b.json", report)
    assert code == 1 and "candidate=k (2 dispatches) in t::x" in text


def test_expect_degrade_property_is_not_gated(tmp_path: Path) -> None:
    report = tmp_path / "r.xml"
    report.write_text(
        f"<testsuites><testsuite name='s'>{suite_totals(('cpu/matmul/k/degraded', 2))}"
        "<testcase classname='t' name='x'><properties>"
        "<property name='arbiter-expect-degrade' value='1'/>"
        "<property name='arbiter:cpu/matmul/k/degraded' value='2'/></properties></testcase>"
        "</testsuite></testsuites>")
    fleet = read_junit(report)
    assert fleet.counts == {("cpu", "matmul", "k", "degraded"): 2} and fleet.gated() == {}
    assert run("gate", "--baseline", tmp_path / "b.json", report)[0] == 0


def test_console_script_and_no_pytest_import(tmp_path: Path) -> None:
    code = ("import sys, pytest_arbiter.cli, pytest_arbiter.junit\n"
            "assert 'pytest' not in sys.modules and '_pytest' not in sys.modules\n"
            "sys.exit(pytest_arbiter.cli.main(['--version']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "pytest-arbiter 0.1.0"
    proc = subprocess.run([sys.executable, "-m", "pytest_arbiter.cli", "show",
                           str(tmp_path / "missing.json")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "missing.json" in proc.stderr
