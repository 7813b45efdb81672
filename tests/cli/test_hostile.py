"""Hostile and damaged artifacts given to the CLI.

The fleet gate fails closed: a damaged report or histogram is an error (exit 2, the
file named, no traceback), never a degrade gone; byte-mutated real artifacts prove it.
Hostile input (deep nesting, lone surrogates, numbers that overflow to infinity,
duplicate keys, byte order marks, non-UTF-8) is a clear error, and every name that came
from a runner's file is printed escaped. The readers themselves: tests/gating/ and
tests/store/; the plugin's side: tests/plugin/test_hostile.py.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating import histogram_file, junit
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import MeasureCache
from tests.factories import ranked_entry
from tests.hostile import (
    DEGRADE,
    EVIL,
    HOSTILE_JSON,
    assert_clear_error,
    assert_safe_output,
    case_xml,
    histogram_text,
    run_cli,
    suite_xml,
)

# -- the histogram and baseline format -------------------------------------------------


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_a_hostile_histogram_is_a_clear_error_as_input_and_as_baseline(
        tmp_path: Path, name: str) -> None:
    data, needle = HOSTILE_JSON[name]
    hostile = tmp_path / f"{name}.json"
    hostile.write_bytes(data)
    good = tmp_path / "good.json"
    good.write_text(histogram_text(DEGRADE))
    assert_clear_error(run_cli("gate", "--baseline", tmp_path / "none.json", good, hostile),
                       hostile, needle)
    assert_clear_error(run_cli("gate", "--baseline", hostile, good), hostile, needle)


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
    assert_clear_error(run_cli(*argv), hostile)
    assert good.read_bytes() == before


# -- names from runners' files are printed escaped -----------------------------------------


def test_gate_escapes_names_from_a_histogram(tmp_path: Path) -> None:
    hostile = tmp_path / "h.json"
    histogram_file.write_histogram(hostile, {("cpu", "::op", EVIL, "degraded"): 2})
    baseline = tmp_path / "base.json"
    histogram_file.write_histogram(baseline, {("cpu", "::op", EVIL, "error"): 1,
                                         ("cpu", "other", EVIL, "degraded"): 1})
    code, out, err = run_cli("gate", "--baseline", baseline, hostile)
    assert code == 1 and "NEW degraded: target=cpu op=::op candidate=k\\n::error" in out
    assert "fixed error" in out and "unchecked degraded" in out
    assert_safe_output(out + err)


def test_gate_escapes_names_from_a_junit_report(tmp_path: Path) -> None:
    # XML can carry a line break (&#10;) and C1 controls (&#x9b; is CSI) in attributes
    key = "cpu/m/k&#10;::error::pwned&#x9b;2J/degraded"
    report = tmp_path / "report.xml"
    report.write_text(suite_xml(case_xml("t&#10;::warning::x", **{f"arbiter:{key}": 1}),
                                {key: 1}))
    code, out, err = run_cli("gate", "--baseline", tmp_path / "none.json", report)
    assert code == 1 and "candidate=k\\n::error::pwned\\x9b2J" in out, out + err
    assert "in t::t\\n::warning::x" in out
    assert_safe_output(out + err)


def test_error_messages_are_escaped(tmp_path: Path) -> None:
    hostile = tmp_path / "h.json"
    hostile.write_text(histogram_text(DEGRADE.replace(
        '"count"', '"\\u001b[31m\\n::error::x"')))
    code, out, err = run_cli("gate", "--baseline", tmp_path / "none.json", hostile)
    assert code == 2 and "unknown field" in err
    assert_safe_output(out + err)


def test_show_diff_and_merge_escape_names_from_caches(tmp_path: Path) -> None:
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    artifacts.write_cache(old, MeasureCache([
        ranked_entry("k", EVIL, "w\u202ex", device="::error::dev", host="\x1b[31mh"),
        ranked_entry("gone\n::x", "y")]))
    artifacts.write_cache(new, MeasureCache([
        ranked_entry("k", "w\u202ex", EVIL, device="::error::dev", host="##[h]"),
        ranked_entry("added\r::x", EVIL)]))
    texts = []
    for argv in (["show", "--wide", old], ["show", "--wide", new], ["diff", old, new],
                 ["merge", "-o", tmp_path / "out.json", old, new]):
        code, out, err = run_cli(*argv)
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
    code, _, err = run_cli("gate", "--baseline", tmp_path / "b.json", tmp_path / "r.xml")
    assert code == 2 and "internal error: RuntimeError: boom\\n::error::x" in err
    assert_safe_output(err)


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

NEW_DEGRADE = "NEW degraded: target=cpu op=fz_mm candidate=fz_declining (1 dispatch)"
NEW_LINE = f"{NEW_DEGRADE} in test_one.py::test_degrade"
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
        code, out, _ = run_cli("gate", "--baseline", fleet / "baseline.json", fleet / report)
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
     "the testcases record 1 dispatch and 0 were outside any test, but the suite total "
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
    assert_clear_error(run_cli("gate", "--baseline", fleet / "baseline.json", edited), edited,
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
    assert_clear_error(run_cli("gate", "--baseline", fleet / "baseline.json", fleet / "older.xml"),
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
            code, out, err = run_cli("gate", "--baseline", mutant, fleet / "xunit2.xml")
        else:
            code, out, err = run_cli("gate", "--baseline", baseline, mutant)
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
