"""The pytest-arbiter CLI on real files: show, merge, diff, and the fleet gate on JUnit
reports that pytest wrote (xunit2, with and without xdist)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.gating import histogram_file
from pytest_arbiter.gating.junit import case_id, parse_property, read_junit
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, MeasureCache, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats
from tests.factories import cache_entry, ranked_entry, stats

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


# -- show, merge, diff --------------------------------------------------------------------


def test_show_prints_a_table_and_json(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([ranked_entry("m64", "wmma", "cublas"),
                                              ranked_entry("m32", "cublas")]))
    code, text = run("show", "--wide", path)
    assert code == 0
    lines = text.splitlines()
    assert lines[0].split()[:6] == ["device", "target", "op", "bucket", "dtype", "winner"]
    assert "wmma" in lines[2] and "cublas +50.0%" in lines[2] and "1.00 us" in lines[2]
    assert lines[-1] == "2 entries on 1 device (sm_90)"
    code, text = run("show", "--json", path)
    data = json.loads(text)
    assert code == 0 and [d["winner"] for d in data] == ["cublas", "wmma"]
    assert data[1]["ranking"][1] == {"name": "cublas", **stats(1500.0).to_dict(),
                                     "carried": False}


def test_show_with_a_filter_that_matches_nothing_names_what_the_file_holds(
        tmp_path: Path) -> None:
    """A filter that matches nothing says so, and which devices and ops there are, not
    "no entries"; ``--device`` takes a target (``cpu``) for all its devices, whose tags
    are longer; a long tag is cut before the bucket and dtype in the key column."""
    import msgspec

    from tests.factories import cache_entry

    path = tmp_path / "c.json"
    tag = "cpu-x86_64-intel-r-xeon-r-processor"
    artifacts.write_cache(path, MeasureCache([
        msgspec.structs.replace(cache_entry(device=tag, bucket=f"a2.1-b3.{n}"),
                                op="scaled_matmul") for n in range(2)]))
    code, text = run("show", "--device", "gpu", path)
    assert code == 0
    assert text.strip() == (f"{path}: no entry matches --device gpu (devices: "
                            f"{tag}; ops: scaled_matmul)")
    for device in ("cpu", tag):
        code, text = run("show", "--op", "scaled_matmul", "--device", device, path)
        assert code == 0 and "2 entries on 1 device" in text
        keys = [line.split()[0] for line in text.splitlines()[1:3]]
        assert [k.rsplit("/", 2)[1:] for k in keys] == [["a2.1-b3.0", "float32"],
                                                        ["a2.1-b3.1", "float32"]]
        assert all("/scaled_matmul/" in k and len(k) <= 44 for k in keys)


def test_show_json_is_the_to_dict_form_byte_for_byte(tmp_path: Path) -> None:
    """``show --json`` is made by msgspec, chunk by chunk; its text is still exactly what
    ``json.dump(indent=2, sort_keys=True)`` of :meth:`CacheEntry.to_dict` gives: numbers
    Python writes otherwise (``1e-05``, ``1e+16``), names past ASCII, DEL and control
    characters escaped, ``since`` only when known. Through a real stdout too."""
    import datetime

    from pytest_arbiter.store import cache_json
    from pytest_arbiter.store.entry import PROVENANCE_KEYS

    odd = CacheEntry(
        "dev\x1b[31m\u2028\u00e9\U0001f600\x7f", "cpu", "op\n::error::x", 'b"\\', "float32",
        (RankedCandidate("k\u202e", LatencyStats(1e-5, 2.5e-7, 5e-6, 1.5e16, 1e300, 3)),
         RankedCandidate("z", LatencyStats(3, 3, 3, 3, 3, 1))),
        0.5, True, {"x\u00ff": "why\n::warning"},
        {"host": "h\t", "p_value": 1.2e-05, "shapes": [[], [1, 2]],
         "measured_at": "2026-12-03T06:00:00Z", "versions": {"numpy": "2.1"}, "rounds": 7,
         "timed_alone": True, "spent_ns": 12, "timed_ns": 5},
        {"k\u202e": {"fingerprint": "f" * 16, "outcome": "timed"},
         "q": {"fingerprint": "0e12", "outcome": "rejected", "reason": "err 1e-3"}},
        {"device_name": "\u00dc"}, True,
        datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc))
    plain = [ranked_entry(f"m{i}", "wmma", "cublas", medians=(1000.5 + i, 1e-5 * (i + 1)))
             for i in range(30)]
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([odd, *plain]))
    entries = artifacts.read_cache(path).entries()
    expected = json.dumps([e.to_dict() for e in entries], indent=2, sort_keys=True,
                          allow_nan=False) + "\n"
    assert expected.isascii() and "1e-05" in expected and "1e+300" in expected
    assert '"timed_alone": true' in expected  # every provenance key, as to_dict has it
    assert cache_json._Provenance.__struct_fields__ == PROVENANCE_KEYS
    code, text = run("show", "--json", path)
    assert code == 0 and text == expected
    assert run("show", "--json", "--op", "none", path) == (0, "[]\n")
    for per_chunk in (1, 7):  # the joints between chunks
        cache_json.ENTRIES_PER_CHUNK, was = per_chunk, cache_json.ENTRIES_PER_CHUNK
        try:
            assert run("show", "--json", path)[1] == expected
        finally:
            cache_json.ENTRIES_PER_CHUNK = was
    proc = subprocess.run([sys.executable, "-m", "pytest_arbiter.cli.main", "show", "--json",
                           str(path)], capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.decode("ascii") == expected


def test_merge_into_a_corpus_that_is_also_an_input(tmp_path: Path) -> None:
    corpus, a, b = tmp_path / "corpus.json", tmp_path / "a.json", tmp_path / "b.json"
    artifacts.write_cache(corpus, MeasureCache([ranked_entry("old", "x")]))
    artifacts.write_cache(a, MeasureCache([ranked_entry("k", "wmma", "cublas", host="ra"),
                                           ranked_entry("ka", "x")]))
    artifacts.write_cache(b, MeasureCache([ranked_entry("k", "cublas", "wmma", host="rb",
                                                 confidence=0.9995),
                                           ranked_entry("kb", "x")]))
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
    artifacts.write_cache(corpus, MeasureCache([ranked_entry("old", "x")]))
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
    artifacts.write_cache(old, MeasureCache([ranked_entry("k", "wmma", "cublas"),
                                             ranked_entry("gone", "x")]))
    artifacts.write_cache(new, MeasureCache([
        ranked_entry("k", "cublas", "wmma", medians=(800.0, 1200.0)), ranked_entry("added", "x")]))
    code, text = run("diff", old, new)
    assert code == 0
    assert ("changed sm_90/nvidia/matmul/k/float16: wmma (1.00 us) -> cublas (800 ns, -20.0%); "
            "wmma now 50.0% slower") in text
    assert "added sm_90/nvidia/matmul/added/float16: x" in text
    assert "removed sm_90/nvidia/matmul/gone/float16: x" in text
    assert text.endswith("1 winner changed, 1 key added, 1 removed, 0 unchanged\n")


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run()[0] == 2
    assert run("gate")[0] == 2  # an input is required
    assert "INPUT" in capsys.readouterr().err
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


@pytest.mark.xdist
def test_gate_fails_on_a_new_degrade_naming_it_and_its_tests(
        reports: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, text = run("gate", "--baseline", reports / "none.json", reports / "plain.xml")
    assert code == 1, text
    assert "none.json does not exist yet: it counts as empty" in text
    assert ("NEW degraded: target=cpu op=cli_mm candidate=cli_declining (3 dispatches) in "
            "test_one.py::test_dispatch[0], test_one.py::test_dispatch[1], "
            "test_one.py::test_dispatch[2]") in text
    assert "degrade gate FAILED: 1 new degraded, rejected or error entries" in text
    assert "softmax" not in text.split("NEW")[1]  # won dispatches are not gated
    # no --baseline at all: the same verdict, as a pytest run without --arbiter-baseline
    code, bare = run("gate", reports / "plain.xml")
    assert code == 1, bare
    assert "no --baseline given: every degraded, rejected or error entry is new" in bare
    assert bare.split("\n")[1:] == text.split("\n")[1:]
    # and --update has no file to tighten
    capsys.readouterr()
    assert run("gate", "--update", reports / "plain.xml")[0] == 2
    assert "--update tightens the --baseline file: name it" in capsys.readouterr().err


@pytest.mark.xdist
def test_gate_passes_on_a_known_degrade(reports: Path) -> None:
    for report in ("plain.xml", "xdist.xml", "hist.json"):
        code, text = run("gate", "--baseline", reports / "base.json", reports / report)
        assert code == 0, text
        assert "known degraded: target=cpu op=cli_mm candidate=cli_declining" in text
        assert "degrade gate passed (1 known gated entry)" in text


@pytest.mark.xdist
def test_a_report_named_twice_is_counted_once(reports: Path) -> None:
    """``reports/*.xml reports/plain.xml``: one file by a glob and by its name."""
    once = run("gate", "--baseline", reports / "none.json", reports / "plain.xml")
    twice = run("gate", "--baseline", reports / "none.json", reports / "plain.xml",
                reports / "." / "plain.xml")
    assert "(3 dispatches)" in once[1] and "(3 dispatches)" in twice[1], twice[1]
    assert f"{reports / '.' / 'plain.xml'}: named twice, read once" in twice[1]


@pytest.mark.xdist
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


@pytest.mark.xdist
def test_gate_merges_runners_and_reports_fixed_and_unchecked(reports: Path) -> None:
    baseline = reports / "base.json"
    counts = histogram_file.read_histogram(baseline)
    counts[("cpu", "cli_mm", "retired_kernel", "degraded")] = 2
    counts[("nvidia", "matmul", "wmma", "degraded")] = 1
    histogram_file.write_histogram(baseline, counts)
    code, text = run("gate", "--baseline", baseline, reports / "plain.xml",
                     reports / "xdist.xml")
    assert code == 0, text
    assert "read 2 reports, 10 testcases" in text
    assert "known degraded: target=cpu op=cli_mm candidate=cli_declining (6 dispatches" in text
    assert "fixed degraded: target=cpu op=cli_mm candidate=retired_kernel" in text
    assert ("unchecked degraded: target=nvidia op=matmul candidate=wmma (no report "
            "dispatched nvidia/matmul: kept in the baseline)") in text
    code, text = run("gate", "--update", "--baseline", baseline, reports / "plain.xml")
    assert code == 0 and "1 fixed entry removed" in text
    kept = histogram_file.read_histogram(baseline)
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
@pytest.mark.xdist
def test_gate_exits_2_on_an_unreadable_input(reports: Path, name: str, content: str,
                                            message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (reports / name).write_text(content)
    code, text = run("gate", "--baseline", reports / "base.json", reports / "plain.xml",
                     reports / name)
    assert code == 2 and "degrade gate passed" not in text
    assert message in capsys.readouterr().err


@pytest.mark.xdist
def test_gate_exits_2_on_a_missing_input_or_bad_baseline(reports: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    assert run("gate", "--baseline", reports / "base.json", reports / "nope.xml")[0] == 2
    assert "nope.xml" in capsys.readouterr().err
    (reports / "bad-base.json").write_text("[1, 2")
    assert run("gate", "--baseline", reports / "bad-base.json", reports / "plain.xml")[0] == 2


SILENT = ("<testsuites><testsuite name='s'><testcase classname='t' name='x'/>"
          "</testsuite></testsuites>")


def test_gate_fails_closed_on_a_report_without_arbiter_data(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A runner whose plugin was off (or whose suite lost its properties) cannot pass
    the fleet gate unseen beside another runner's report; listed, it may."""
    silent, good = tmp_path / "silent.xml", tmp_path / "good.xml"
    silent.write_text(SILENT)
    good.write_text("<testsuites><testsuite name='pytest'><properties>"
                    "<property name='arbiter-report' value='1'/>"
                    "<property name='arbiter-total:cpu/matmul/k/won' value='1'/>"
                    "</properties><testcase classname='t' name='x'><properties>"
                    "<property name='arbiter:cpu/matmul/k/won' value='1'/></properties>"
                    "</testcase></testsuite></testsuites>")
    assert run("gate", "--baseline", tmp_path / "b.json", good)[0] == 0
    code, _ = run("gate", "--baseline", tmp_path / "b.json", good, silent)
    err = capsys.readouterr().err
    assert code == 2 and "silent.xml" in err and "--allow-no-data" in err
    code, text = run("gate", "--baseline", tmp_path / "b.json", good, silent,
                     "--allow-no-data", silent)
    assert code == 0, text
    code, text = run("gate", "--baseline", tmp_path / "b.json", "--allow-no-data",
                     silent, silent)
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


# -- forget ---------------------------------------------------------------------------


def aged(bucket: str, winner: str, *, days: float | None, device: str = "sm_90",
         op: str = "matmul", runner_up: str = "cublas", rejected: dict[str, str] | None = None,
         considered: tuple[str, ...] = ()) -> CacheEntry:
    """An entry measured ``days`` ago (``None``: no measured_at)."""
    import datetime

    prov: dict[str, object] = {"host": "h1"}
    if days is not None:
        when = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=days)
        prov["measured_at"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    return CacheEntry(device, "nvidia", op, bucket, "float16",
                      (RankedCandidate(winner, stats(1000.0)),
                       RankedCandidate(runner_up, stats(1500.0))), 0.999, False,
                      rejected or {}, prov,
                      {n: {"fingerprint": "f" * 16, "outcome": "declined"} for n in considered})


def forget_corpus(path: Path) -> None:
    artifacts.write_cache(path, MeasureCache([
        aged("a", "wmma", days=40), aged("b", "wmma", days=10),
        aged("c", "tiled", days=40, op="softmax"),
        aged("d", "tiled", days=40, device="sm_120", rejected={"fused": "out of budget"}),
        aged("e", "tiled", days=1, considered=("fused",)),
        aged("f", "tiled", days=None)]))


def buckets(path: Path) -> list[str]:
    return sorted(e.bucket for e in artifacts.read_cache(path).entries())


def test_forget_each_filter_and_all_of_them_together(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cases = [
        (["--device", "sm_120"], ["a", "b", "c", "e", "f"]),
        (["--op", "softmax"], ["a", "b", "d", "e", "f"]),
        # named in the ranking (as winner or runner-up), the rejected, the considered
        (["--candidate", "wmma"], ["c", "d", "e", "f"]),
        (["--candidate", "cublas"], []),
        (["--candidate", "fused"], ["a", "b", "c", "f"]),
        (["--older-than", "30d"], ["b", "e", "f"]),
        (["--older-than", "36h"], ["e", "f"]),
        (["--before", "2000-01-01"], ["a", "b", "c", "d", "e", "f"]),
        (["--before", "2999-01-01T00:00:00+02:00"], ["f"]),
        # filters combine with AND
        (["--older-than", "30d", "--candidate", "wmma"], ["b", "c", "d", "e", "f"]),
        (["--older-than", "30d", "--before", "2999-01-01", "--device", "sm_90",
          "--op", "matmul"], ["b", "c", "d", "e", "f"]),
        (["--all"], []),
    ]
    for argv, left in cases:
        forget_corpus(path)
        code, text = run("forget", *argv, path)
        assert code == 0, (argv, text)
        assert buckets(path) == left, argv
        removed = 6 - len(left)
        assert text.splitlines()[-1] == (
            f"{path}: removed {removed} entries, {len(left)} remain" if removed else
            f"{path}: no entry matches; nothing removed, 6 remain")
        assert len([ln for ln in text.splitlines() if ln.startswith("forgot ")]) == removed
    forget_corpus(path)
    code, text = run("forget", "--older-than", "30d", path)
    assert "forgot sm_90/nvidia/matmul/a/float16: winner wmma, measured 20" in text
    # the entry without measured_at is of unknown age: kept, and said so
    assert "kept 1 entries that match but do not say when they were measured" in text
    before = path.read_bytes()
    code, text = run("forget", "--device", "nowhere", path)
    assert (code, text) == (0, f"{path}: no entry matches; nothing removed, 3 remain\n"
                               f"{path}: its devices: sm_90\n")
    assert path.read_bytes() == before


def test_forget_dry_run_lists_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    forget_corpus(path)
    artifacts.lock_path(path).unlink()
    before = path.read_bytes()
    when = next(e for e in artifacts.read_cache(path) if e.bucket == "c").provenance.measured_at
    code, text = run("forget", "--dry-run", "--op", "softmax", path)
    assert code == 0 and text.splitlines() == [
        f"would forget sm_90/nvidia/softmax/c/float16: winner tiled, measured {when}",
        f"{path}: 1 entries would be removed, 5 would remain (dry run: nothing written)"]
    assert path.read_bytes() == before and not artifacts.lock_path(path).exists()


@pytest.mark.parametrize(("argv", "said"), [
    ([], "name what to forget"),
    (["--dry-run"], "name what to forget"),
    (["--all", "--op", "matmul"], "--all forgets every entry: it takes no other filter"),
    (["--older-than", "30"], "argument --older-than: '30' is not an age"),
    (["--older-than=-3d"], "argument --older-than: '-3d' is not an age"),
    (["--older-than", "1e999d"], "argument --older-than"),
    (["--before", "yesterday"], "argument --before: 'yesterday' is not a date"),
    (["--before", "2026-02-30"], "argument --before"),
    (["--device", ""], "argument --device: an empty name"),
    (["--candidate", ""], "argument --candidate: an empty name"),
    (["--lock-timeout", "soon", "--all"], "argument --lock-timeout"),
])
def test_forget_refuses_no_filter_and_bad_values(tmp_path: Path, argv: list[str], said: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    forget_corpus(path)
    before = path.read_bytes()
    capsys.readouterr()
    assert run("forget", *argv, path)[0] == 2
    assert said in capsys.readouterr().err
    assert path.read_bytes() == before


def test_forget_a_missing_or_bad_cache_is_exit_2(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.json"
    assert run("forget", "--all", missing)[0] == 2
    assert "cannot read" in capsys.readouterr().err and not missing.exists()
    assert not artifacts.lock_path(missing).exists()
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"schema": "pytest-arbiter/cache", "version": 3, "entries": [}')
    assert run("forget", "--all", bad)[0] == 2
    assert "bad.json is not valid JSON" in capsys.readouterr().err
    assert bad.read_bytes().endswith(b"[}")


def test_forget_escapes_names_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([
        aged("x\n::error::forged", "k\x1b[31m", days=3, op="op\u2028")]))
    code, text = run("forget", "--dry-run", "--candidate", "k\x1b[31m", path)
    assert code == 0
    assert "x\\n::error::forged" in text and "k\\x1b[31m" in text and "op\\u2028" in text
    assert "\x1b" not in text and "\u2028" not in text
    assert not any(line.lstrip().startswith("::") for line in text.splitlines())


def test_forget_through_a_symlink_writes_the_target(tmp_path: Path) -> None:
    real = tmp_path / "store" / "corpus.json"
    real.parent.mkdir()
    forget_corpus(real)
    link = tmp_path / "corpus.json"
    link.symlink_to(real)
    assert run("forget", "--op", "softmax", link)[0] == 0
    assert link.is_symlink() and buckets(real) == ["a", "b", "d", "e", "f"]
    assert artifacts.lock_path(link) == real.with_name("corpus.json.lock")


HOLDER = """
import sys, time
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats

path, hold = sys.argv[1], float(sys.argv[2])
with artifacts.cache_lock(path):
    # another writer adds an entry while it holds the lock (as update_cache does)
    entries = artifacts.read_cache(path).entries()
    stats = LatencyStats(900, 800, 850, 950, 1000, 9)
    entries.append(CacheEntry("sm_90", "nvidia", "matmul", "added", "float16",
                              (RankedCandidate("wmma", stats),)))
    artifacts._write_entries(path, entries)
    print("locked", flush=True)
    time.sleep(hold)
print("released", flush=True)
"""


def hold_lock(path: Path, seconds: float) -> subprocess.Popen[str]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def test_forget_waits_for_another_writers_lock_and_keeps_its_entries(tmp_path: Path) -> None:
    """A real process holds the lock and adds an entry meanwhile: forget waits, then
    reads the file under the lock, so the other writer's entry is not lost."""
    import time

    path = tmp_path / "c.json"
    forget_corpus(path)
    holder = hold_lock(path, 1.5)
    try:
        start = time.monotonic()
        code, text = run("forget", "--candidate", "wmma", path)
        waited = time.monotonic() - start
    finally:
        holder.wait(timeout=60)
        assert holder.stdout is not None
        holder.stdout.close()
    assert code == 0, text
    assert waited > 0.5
    # "added" (wmma, written by the holder) went too, with a and b; the rest stay
    assert buckets(path) == ["c", "d", "e", "f"]
    assert text.splitlines()[-1] == f"{path}: removed 3 entries, 4 remain"


def test_forget_gives_up_on_a_held_lock_and_leaves_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.json"
    forget_corpus(path)
    holder = hold_lock(path, 120)
    try:
        written = path.read_bytes()  # with the holder's entry
        assert run("forget", "--all", "--lock-timeout", "0.3", path)[0] == 2
        assert "cannot lock" in capsys.readouterr().err
        assert path.read_bytes() == written
        # a dry run only reads: it does not wait
        code, text = run("forget", "--dry-run", "--all", path)
        assert code == 0 and "7 entries would be removed" in text
    finally:
        holder.kill()
        holder.wait()
        assert holder.stdout is not None
        holder.stdout.close()


def test_console_script_and_no_pytest_import(tmp_path: Path) -> None:
    # nor NumPy: the commands read and write artifacts, a second's start-up each time
    code = ("import sys, pytest_arbiter.cli.main, pytest_arbiter.gating.junit\n"
            "import pytest_arbiter.store.artifacts, pytest_arbiter.timing.measure\n"
            "assert 'pytest' not in sys.modules and '_pytest' not in sys.modules\n"
            "assert 'numpy' not in sys.modules\n"
            "sys.exit(pytest_arbiter.cli.main.main(['--version']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "pytest-arbiter 0.1.0"
    proc = subprocess.run([sys.executable, "-m", "pytest_arbiter.cli.main", "show",
                           str(tmp_path / "missing.json")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "missing.json" in proc.stderr


def test_latencies_print_three_significant_digits_across_units() -> None:
    from pytest_arbiter.cli.main import format_ns

    assert [format_ns(v) for v in (0.5, 999.4, 999.6, 13_500.0, 999_700.0, 4e6,
                                   999_999_600.0, 2.5e9)] == [
        "0.50 ns", "999 ns", "1.00 us", "13.5 us", "1.00 ms", "4.00 ms", "1.00 s", "2.50 s"]


def test_shows_closing_line_fits_100_columns_with_long_device_tags(tmp_path: Path) -> None:
    """Several long CPU tags: the summary names them on lines of their own, each line
    within the 100 columns the table fits; ``--wide`` keeps the one line."""
    from tests.factories import cache_entry

    path = tmp_path / "c.json"
    tags = [f"cpu-x86_64-intel-r-xeon-r-platinum-{n}-processor" for n in range(4)]
    artifacts.write_cache(path, MeasureCache([cache_entry(device=tag) for tag in tags]))
    code, text = run("show", path)
    assert code == 0
    lines = text.splitlines()
    assert max(map(len, lines)) <= 100
    assert lines[-3:] == ["4 entries on 4 devices:",
                          "  " + ", ".join(tags[:2]) + ",", "  " + ", ".join(tags[2:])]
    code, text = run("show", "--wide", path)
    assert text.splitlines()[-1] == f"4 entries on 4 devices ({', '.join(tags)})"


def test_device_picks_alike_in_show_export_and_forget(tmp_path: Path) -> None:
    """``--device`` takes a tag or a target (``cpu``: every CPU device's entries) in
    ``show``, ``export`` and ``forget``; a device no entry has is said, with the devices
    the file does have, not a silent zero."""
    path = tmp_path / "c.json"
    entries = [cache_entry("b1", device="cpu-x86_64-a"), cache_entry("b2", device="cpu-x86_64-b")]
    artifacts.write_cache(path, MeasureCache(entries))
    code, text = run("export", "--format", "pytest-benchmark", path, "--device", "cpu")
    assert code == 0 and len(json.loads(text)["benchmarks"]) == 4
    code, text = run("forget", path, "--device", "cpu", "--dry-run")
    assert code == 0 and "2 entries would be removed, 0 would remain" in text
    code, text = run("forget", path, "--device", "cpu-x86_64-c", "--dry-run")
    assert code == 0 and "its devices: cpu-x86_64-a, cpu-x86_64-b" in text
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code, _ = run("export", "--format", "pytest-benchmark", path, "--device", "nosuch")
    assert code == 0 and "no entry matches --device nosuch (devices: cpu-x86_64-a" in err.getvalue()
