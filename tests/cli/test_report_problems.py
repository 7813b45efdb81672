"""The report's problem table, row by row: the keys a row concerns (a degraded
candidate's are the keys it wins, nothing else), which of the corpus's records are
reasons (a failure, never a candidate declining inputs), what to do about each kind,
and where its keys and test ids may wrap (between their parts, never inside a number
or a name), checked in Chromium too."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.cli.report_cells import breakable, breakable_id
from pytest_arbiter.cli.report_problems import (
    REMEDIES,
    HistogramInput,
    Problems,
    section,
)
from pytest_arbiter.gating.baseline import GATE_REMEDY
from pytest_arbiter.gating.histogram import HistogramKey
from pytest_arbiter.gating.junit import PROPERTY_PREFIX, property_name, suite_properties
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, Considered, MeasureCache
from tests.browser import chromium_page, needs_chromium
from tests.factories import ranked_entry

DEVICE = "cpu-x86_64-intel-r-xeon-r-processor"
DEGRADED = HistogramKey("cpu", "t7_rowsum", "rs_numba", "degraded")
REJECTED = HistogramKey("cpu", "t7_rowsum", "rs_bad", "rejected")


def row(outcome: str, reason: str = "") -> Considered:
    return Considered("3f9d0c2a71b4e865", outcome, reason)  # type: ignore[arg-type]


def entry(bucket: str, dtype: str, winner: str, **considered: Considered) -> CacheEntry:
    """A t7_rowsum entry ``winner`` wins over rs_numpy, with ``considered`` rows."""
    names = (winner, "rs_numpy") if winner != "rs_numpy" else ("rs_numpy",)
    rows = {name: row("timed") for name in names} | considered
    return _on_cpu(ranked_entry(bucket, *names, device=DEVICE, op="t7_rowsum", dtype=dtype,
                                considered=rows))


def _on_cpu(e: CacheEntry) -> CacheEntry:
    """``e`` on the ``cpu`` target (the factory's are NVIDIA's)."""
    return CacheEntry(e.device, "cpu", e.op, e.bucket, e.dtype, e.ranking, e.confidence,
                      e.tie, dict(e.rejected), e.provenance, dict(e.considered))


DECLINED = "declined the inputs (accepts() returned False)"
ENTRIES = [
    # rs_numba wins float32; its accepts() turns float16 down (ordinary: rs_numpy wins)
    entry("8x16/a1.16/r2", "float32", "rs_numba"),
    entry("8x16/a1.16/r2", "float16", "rs_numpy", rs_numba=row("accepts_declined", DECLINED)),
    entry("8x32/a1.1/r2", "float16", "rs_numpy", rs_numba=row("declined", "raised Decline"),
          rs_bad=row("accepts_declined", DECLINED)),
    entry("8x32/a1.1/r2", "float32", "rs_numba",
          rs_bad=row("rejected", "failed the F4 gate: output is all zeros")),
    entry("8x64/a2.8/r2", "float32", "rs_numpy", rs_numba=row("unavailable", "no numba"),
          rs_bad=row("inputs_declined", "declined the only inputs")),
]


def problems(*counted: HistogramKey) -> dict[str, Any]:
    """The table's rows over :data:`ENTRIES`, by outcome: their keys and reasons."""
    found = Problems([HistogramInput("r2.xml", dict.fromkeys(counted, 3))])
    for n, e in enumerate(ENTRIES):
        found.add(e, f"{n:03}")
    return {p.outcome: p for p in found.rows()}


def test_a_degraded_row_lists_exactly_the_keys_its_candidate_wins() -> None:
    degraded = problems(DEGRADED)["degraded"]
    assert [(k.bucket, k.dtype) for k in degraded.keys] == [
        ("8x16/a1.16/r2", "float32"), ("8x32/a1.1/r2", "float32")]
    assert degraded.key_count == 2


def test_declining_inputs_when_measured_is_no_reason() -> None:
    """accepts_declined, declined, inputs_declined, unavailable: another candidate ran;
    only a failure the corpus records (rejected, error) is a reason, and its key."""
    rows = problems(DEGRADED, REJECTED)
    assert not any("when measured" in r for r in rows["degraded"].reasons)
    assert rows["degraded"].reasons and "accepts" not in " ".join(rows["degraded"].reasons)
    rejected = rows["rejected"]
    assert rejected.reasons == ["when measured: failed the F4 gate: output is all zeros"]
    assert [(k.bucket, k.dtype) for k in rejected.keys] == [("8x32/a1.1/r2", "float32")]


def test_the_corpus_alone_lists_failures_not_declines() -> None:
    rows = problems()
    assert sorted(rows) == ["rejected"]
    assert rows["rejected"].what == ("cpu", "t7_rowsum", "rs_bad")


# -- what to do ---------------------------------------------------------------------------


def test_each_kind_of_problem_says_what_to_do() -> None:
    rows = list(problems(DEGRADED, REJECTED).values())
    html = "\n".join(section(rows, [HistogramInput("r2.xml", {})], {}))
    remedies = html[html.index('<ul class="remedies">'):]
    assert remedies.count("<li>") == 2
    assert f"degraded</span>: {GATE_REMEDY}" in remedies
    assert "install what it needs" in remedies and "re-tune" in remedies
    assert f"rejected</span>: {GATE_REMEDY}" in remedies
    assert "error</span>" not in remedies  # no error row: no line for it
    assert set(REMEDIES) >= {"degraded", "rejected", "error"}


def test_the_remedy_is_the_gates_own_words(tmp_path: Path) -> None:
    """The page says what ``pytest-arbiter gate`` says when it fails."""
    report = junit(tmp_path / "r.xml", {"test_t7.py::test_rowsum[float32-16]": DEGRADED})
    out = io.StringIO()
    assert main(["gate", str(report)], out=out) == 1
    assert f"({GATE_REMEDY})" in out.getvalue()


# -- where keys and test ids wrap ---------------------------------------------------------


def test_keys_break_only_after_slashes_and_commas() -> None:
    key = f"{DEVICE}/cpu/t7_axpb/4x64/a4.16/r2.0.0/float32,py_float,py_float"
    assert breakable(key).split("<wbr>") == [
        f'<span class="nowrap">{DEVICE}/</span>', "cpu/", "t7_axpb/", "4x64/", "a4.16/",
        "r2.0.0/", "float32,", "py_float,", "py_float"]
    # a very long part: also between its dimensions, never inside a name
    assert breakable("x" * 30 + "'") == "x" * 30 + "&#x27;"
    assert breakable("256x" * 8 + "1/a" + "16." * 9 + "1").split("<wbr>") == [
        *["256x"] * 8, "1/", "a16.", *["16."] * 8, "1"]


def test_test_ids_break_only_after_colons_slashes_brackets_and_hyphens() -> None:
    assert breakable_id("tests/test_t7.py::test_cumsum[float32-2000]").split("<wbr>") == [
        "tests/", "test_t7.py::", "test_cumsum[", "float32-", "2000]"]
    assert breakable_id("t.py::test_<b>") == "t.py::<wbr>test_&lt;b&gt;"


def junit(path: Path, cases: Mapping[str, HistogramKey]) -> Path:
    """A JUnit report of one run: each test dispatching its key 3 times."""
    totals = dict.fromkeys(cases.values(), 0)
    for key in cases.values():
        totals[key] += 3
    suite = ET.Element("testsuite", name="pytest", tests=str(len(cases)))
    props = ET.SubElement(suite, "properties")
    for name, value in suite_properties(totals, totals):
        ET.SubElement(props, "property", name=name, value=value)
    for case_id, key in cases.items():
        classname, _, name = case_id.partition("::")
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0.1")
        ET.SubElement(ET.SubElement(case, "properties"), "property",
                      name=property_name(key, PROPERTY_PREFIX), value="3")
    root = ET.Element("testsuites")
    root.append(suite)
    path.write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))
    return path


def render(tmp_path: Path) -> Path:
    """The page of a user op's corpus (keys with every part a key has) and a report
    of its degraded and rejected candidates, named by long test ids."""
    pytest.importorskip("matplotlib")
    dtypes = ("float16,py_float,py_float", "float32,py_float,py_float")
    buckets = ("4x64/a4.16/r2.0.0", "4x256/a4.1/r2.0.0", "4x1024/a4.8/r2.0.0")
    entries = [_on_cpu(ranked_entry(
        b, "axpb_numba", "axpb_numpy", device=DEVICE, op="t7_axpb", dtype=d,
        considered={"axpb_numba": row("timed"), "axpb_numpy": row("timed"),
                    "axpb_f16_trunc": row("rejected", "failed the F4 gate: error 4.578e-04 "
                                          "at (1, 60) exceeds the allowed 2.660e-04")}))
        for b in buckets for d in dtypes]
    cache = tmp_path / "cache.json"
    artifacts.write_cache(cache, MeasureCache(entries))
    cases = {f"tests/integration/test_t7_user_ops.py::test_axpb_matches_numpy[{d}-{n}]":
             HistogramKey("cpu", "t7_axpb", name, outcome)
             for d in ("float16", "float32") for n in (8, 300, 2000)
             for name, outcome in (("axpb_numba", "degraded"),)}
    cases["tests/integration/test_t7_user_ops.py::test_cumsum[2000]"] = HistogramKey(
        "cpu", "t7_axpb", "axpb_f16_trunc", "rejected")
    page = tmp_path / "report.html"
    (tmp_path / "reports-r2").mkdir()
    junit(tmp_path / "reports-r2" / "r2.xml", cases)
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)  # the report named as CI names it: a short relative path
        assert main(["report", "cache.json", "reports-r2/r2.xml", "-o", "report.html"],
                    out=out) == 0, out.getvalue()
    return page


def test_the_problem_table_breaks_keys_and_ids_between_parts(tmp_path: Path) -> None:
    html = render(tmp_path).read_text(encoding="utf-8")
    problems = html[html.index('id="problems"'):html.index("</section>",
                                                            html.index('id="problems"'))]
    keys = re.findall(r'<td class="keys">(.*?)</td>', problems, re.S)
    assert keys and all("<wbr>" in k for k in keys)
    for piece in re.sub(r"<(?!wbr)[^>]*>", "", "".join(keys)).split("<wbr>"):
        assert re.search(r"[/,]$|py_float$|float\d+$|\d more$", piece), piece
    assert "a4.<wbr>16" not in problems and "test_cumsum[<wbr>2000]" in problems
    css = html[html.index("<style>"):html.index("</style>")]
    cell = css[css.index("td.tests, td.keys"):]
    assert "anywhere" not in cell[:cell.index("}")] and "keep-all" in cell[:cell.index("}")]


BREAKS = """sel => Array.from(document.querySelectorAll(sel)).map(el => {
  const chars = [];
  const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const node = walk.currentNode;
    for (let i = 0; i < node.length; i++) {
      const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
      const box = r.getBoundingClientRect();
      if (box.width) chars.push([node.data[i], box.top]);
    }
  }
  const text = chars.map(c => c[0]).join(''), breaks = [];
  for (let i = 1; i < chars.length; i++)
    if (chars[i][1] > chars[i - 1][1] + 2) breaks.push(text.slice(0, i));
  return {text, breaks};
})"""


@needs_chromium
@pytest.mark.slow
def test_keys_and_ids_wrap_between_parts_in_chromium(tmp_path: Path) -> None:
    """At 1280 px the problem table fits its box, and every line of a key ends after a
    slash or a comma, every line of a test id after ``::``, ``/``, ``[`` or ``-``."""
    page_file = render(tmp_path)
    with chromium_page(1280, 800) as page:
        page.goto(page_file.as_uri())
        page.locator("#problems").screenshot(path=str(tmp_path / "problems.png"))
        box = page.locator("#problems .scroll")
        assert box.evaluate("el => el.scrollWidth <= el.clientWidth")
        keys = page.evaluate(BREAKS, "#problems td.keys a")
        ids = page.evaluate(BREAKS, "#problems td.tests code")
    assert keys and ids and any(k["breaks"] for k in keys) and any(i["breaks"] for i in ids)
    for key in keys:
        assert all(line[-1] in "/," for line in key["breaks"]), key
    for test_id in ids:
        assert all(line.endswith(("::", "/", "[", "-")) for line in test_id["breaks"]), test_id
