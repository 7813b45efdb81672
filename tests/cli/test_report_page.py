"""``pytest-arbiter report`` as a person reads it: the header, the cells (winner, median
with units, marks in words), the one colour scale, the problem table with reasons,
tests and keys, the devices side by side; then in Chromium (playwright, the system's
chromium) at desktop and phone width: what is visible, and that nothing but a table's
or a figure's own box scrolls sideways."""

from __future__ import annotations

import datetime
import io
import itertools
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.cli import report_heatmap
from pytest_arbiter.cli.main import main
from pytest_arbiter.cli.report_cells import (
    SCALE,
    band,
    breakable,
    latency,
    ranking_text,
    when,
)
from pytest_arbiter.cli.report_heatmap import wrap_label
from pytest_arbiter.gating.histogram import HistogramKey
from pytest_arbiter.gating.junit import (
    PROPERTY_PREFIX,
    property_name,
    suite_properties,
)
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, MeasureCache, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats
from tests.browser import chromium_page, needs_chromium

HOSTILE = "<img src=x onerror=alert(1)>\x1b[31m"
SHOWN_HOSTILE = "<img src=x onerror=alert(1)>\\x1b[31m"
"""What a reader sees of it: the tag as text, the escape byte written out."""
MARKUP = "<b>bold</b>&amp;"
"""A hostile name XML can carry (no control character)."""
VERSIONS = {"pytest-arbiter": "0.3.0", "numpy": "2.1.0"}


def stats(median: float, samples: int = 25) -> LatencyStats:
    return LatencyStats(median, median * 0.9, median * 0.95, median * 1.05, median * 1.2,
                        samples)


def entry(device: str, bucket: str, *timed: tuple[str, float], op: str = "matmul",
          dtype: str = "float16", confidence: float = 0.999, reverify: bool = False,
          considered: Mapping[str, Any] | None = None,
          rejected: Mapping[str, str] | None = None,
          ratios: tuple[float | None, ...] | None = None) -> CacheEntry:
    paired = ratios or (None,) * len(timed)
    ranking = tuple(RankedCandidate(name, stats(median), ratio=ratio)
                    for (name, median), ratio in zip(timed, paired, strict=True))
    prov = {"host": f"runner-{device}", "device_name": f"GPU {device}", "rounds": 25,
            "measured_at": "2026-12-03T06:00:00Z", "versions": VERSIONS}
    considered = considered or {name: {"fingerprint": "3f9d0c2a71b4e865",
                                       "outcome": "timed"} for name, _ in timed}
    return CacheEntry(device, "nvidia", op, bucket, dtype, ranking, confidence, False,
                      dict(rejected or {}), prov, dict(considered), reverify=reverify)


def corpus(path: Path) -> Path:
    broken = {"wmma": {"fingerprint": "1", "outcome": "timed"},
              "cublas": {"fingerprint": "2", "outcome": "timed"},
              "split_k": {"fingerprint": "3", "outcome": "rejected",
                          "reason": f"failed the F4 gate: max error 3e-2 {HOSTILE}"}}
    artifacts.write_cache(path, MeasureCache([
        entry("sm_90", "64x64x64", ("wmma", 1000.0), ("cublas", 1500.0), considered=broken),
        entry("sm_90", "128x128x128", ("cublas", 5200.0), ("wmma", 5300.0),
              confidence=0.9),  # low confidence
        entry("sm_90", "64x128/c", ("fused_softmax", 812.0), ("cupy_softmax", 1300.0),
              op="softmax", dtype="float32", reverify=True),  # stale
        entry("sm_120", "64x64x64", ("cublas", 2_400_000.0), (HOSTILE, 9_000_000.0)),
        entry("sm_120", "128x128x128", ("cublas", 7000.0)),
    ]))
    return path


def junit(path: Path) -> Path:
    """A JUnit report of one run: a degrade and an error named by their tests, a
    no_candidate, and a stale key a recheck found."""
    degraded = HistogramKey("nvidia", "matmul", "wmma", "degraded")
    error = HistogramKey("nvidia", "matmul", MARKUP, "error")
    none = HistogramKey("nvidia", "softmax", "none", "no_candidate")
    cases = {"tests.test_mm::test_ragged[7]": {degraded: 3},
             f"tests.test_mm::test_odd[{MARKUP}]": {error: 1}, "tests.test_sm::test_big": {}}
    totals = {degraded: 3, error: 1, none: 2}
    recorded = {degraded: 3, error: 1}
    suite = ET.Element("testsuite", name="pytest", tests=str(len(cases)), errors="0",
                       failures="0", skipped="0")
    props = ET.SubElement(suite, "properties")
    stale = ["nvidia/matmul/64x64x64/float16: stale: cublas 1.31x faster than wmma"]
    for name, value in suite_properties(totals, recorded, stale=stale):
        ET.SubElement(props, "property", name=name, value=value)
    for case_id, found in cases.items():
        classname, _, name = case_id.partition("::")
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time="0.1")
        if found:
            cprops = ET.SubElement(case, "properties")
            for key, count in found.items():
                ET.SubElement(cprops, "property", name=property_name(key, PROPERTY_PREFIX),
                              value=str(count))
    root = ET.Element("testsuites")
    root.append(suite)
    path.write_bytes(ET.tostring(root, encoding="utf-8", xml_declaration=True))
    return path


def render(tmp_path: Path) -> tuple[Path, str]:
    pytest.importorskip("matplotlib")
    page = tmp_path / "report.html"
    out = io.StringIO()
    code = main(["report", str(corpus(tmp_path / "corpus.json")),
                 str(junit(tmp_path / "sm_90.xml")), "-o", str(page)], out=out)
    assert code == 0, out.getvalue()
    return page, page.read_text(encoding="utf-8")


def section(html: str, ident: str) -> str:
    start = html.index(f'id="{ident}"')
    return html[start:html.index("</section>", start)]


def test_the_header_names_date_corpus_versions_devices(tmp_path: Path) -> None:
    _, html = render(tmp_path)
    header = html[html.index("<header>"):html.index("</header>")]
    today = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    assert today in header
    assert str(tmp_path / "corpus.json") in header and "5 entries" in header
    assert "not committed" in header  # tmp_path is no git repository
    assert "pytest-arbiter 0.3.0" in header and "numpy 2.1.0" in header
    assert "sm_90 (GPU sm_90): 3 entries" in header and "sm_120 (GPU sm_120): 2 entries" in header
    assert "2026-12-03T06:00:00Z" in header and "sm_90.xml" in header


def test_each_cell_says_winner_median_and_marks(tmp_path: Path) -> None:
    _, html = render(tmp_path)
    sm90 = section(html, "g-1")  # sm_90 matmul (sm_120 sorts first)
    assert "sm_90 \u00b7 matmul" in sm90
    figure = sm90[sm90.index("<figure"):sm90.index("</figure>")]
    # SVG text: the winner, its median with units, the marks in words
    assert ">wmma<" in figure and ">1.00 \u00b5s<" in figure
    assert ">cublas<" in figure and ">5.20 \u00b5s<" in figure
    assert ">low confidence, stale<" not in figure and ">low confidence<" in figure
    # the stale key a recheck found (the JUnit report) is marked in its cell too
    assert ">stale<" in figure
    # hover: the ranking with units; click: the entry's row
    assert "1. wmma 1.00 \u00b5s (winner)\n2. cublas 1.50 \u00b5s (1.50x" in figure
    assert 'xlink:href="#e-' in figure or 'href="#e-' in figure
    # the table says the same in words, its rows are the links' targets
    flagged = re.findall(r'<tr id="e-\d+" class="flagged">(.*?)</tr>', sm90)
    assert len(flagged) == 2
    assert '<td class="mark">stale</td>' in flagged[0]  # the recheck's key, 64x64x64
    assert '<td class="mark">low confidence</td>' in flagged[1]  # 128x128x128
    assert "<td class=\"num\">5.20 \u00b5s</td>" in sm90
    assert latency(2_400_000.0) == "2.40 ms" and latency(812.0) == "812 ns"


def test_the_hover_and_the_table_say_what_ranked_each_row(tmp_path: Path) -> None:
    """The ranking on hover gives each row's paired ratio (what ranked it) where it is
    recorded, and the table's spread is ``show --wide``'s (IQR over the median)."""
    paired = entry("sm_90", "64x64x64", ("wmma", 1000.0), ("cublas", 990.0),
                   ("naive", 4000.0), ratios=(1.0, 1.04, None))
    assert ranking_text(paired).split("\n") == [
        "1. wmma 1.00 \u00b5s (winner)",
        "2. cublas 990 ns (1.04x the winner in the rounds timed side by side)",
        "3. naive 4.00 \u00b5s (4.00x the winner's median)"]
    _, html = render(tmp_path)
    row = re.search(r'<tr id="e-\d+"[^>]*><td>64x64x64</td>.*?</tr>',
                    section(html, "g-1"))
    assert row is not None and '<td class="num">10.0%</td>' in row.group(0)


def test_one_colour_scale_for_the_page(tmp_path: Path) -> None:
    _, html = render(tmp_path)
    legend = section(html, "scale")
    for step in SCALE:
        assert step.colour in legend and step.label in legend
    # a cell's colour is the scale's colour for its speedup, in every figure
    assert band(1.5).colour.lower() in html.lower()  # wmma over cublas, sm_90
    assert band(9_000_000 / 2_400_000).colour.lower() in html.lower()  # sm_120
    assert "colorbar" not in html and html.count("<svg") == 3


def test_the_problem_table_has_reasons_tests_and_keys(tmp_path: Path) -> None:
    _, html = render(tmp_path)
    problems = section(html, "problems").replace("<wbr>", "")  # where a line may end
    rows = re.findall(r"<tr><td><span class=\"badge (\w+)\">.*?</tr>", problems, re.S)
    assert rows == ["degraded", "rejected", "error", "no_candidate", "stale"]
    assert "tests.test_mm::test_ragged[7]" in problems
    assert "failed the F4 gate: max error 3e-2" in problems  # the corpus's reason
    assert 'href="#e-' in problems and "sm_90/nvidia/matmul/64x64x64/float16" in problems
    assert "cublas 1.31x faster than wmma" in problems
    assert "no candidate of the op applies" in problems
    # a degraded row's keys are the ones its candidate wins: no report says which fell back
    degraded = problems[problems.index('badge degraded'):problems.index('badge rejected')]
    assert "the keys it wins (the reports say not which fell back):" in degraded


def test_devices_side_by_side(tmp_path: Path) -> None:
    _, html = render(tmp_path)
    devices = section(html, "devices")
    assert "2 keys measured on more than one device" in devices
    assert "<th>sm_120</th><th>sm_90</th>" in devices
    assert "2.40 ms (2400.00x)" in devices and "1.00 \u00b5s (fastest)" in devices
    assert "differs" in devices


def test_a_long_group_is_cut_and_every_link_still_lands(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A table lists at most ``MAX_TABLE_ROWS`` rows (a million-row page opens in no
    browser), says how many it left out and which command lists them; a link to an
    entry left out (a due entry) goes to its group's section: no link points nowhere."""
    pytest.importorskip("matplotlib")
    from pytest_arbiter.cli import report

    monkeypatch.setattr(report, "MAX_TABLE_ROWS", 3)
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([
        entry("sm_90", f"{n}x64x64", ("wmma", 1000.0), ("cublas", 1500.0),
              confidence=0.9 if n >= 4 else 0.999) for n in range(1, 8)]))
    page = tmp_path / "r.html"
    assert main(["report", str(path), "-o", str(page)], out=io.StringIO()) == 0
    html = page.read_text(encoding="utf-8")
    group = section(html, "g-0")
    assert group.count('<tr id="e-') == 3
    assert ("first 3 of 7 entries; <code>pytest-arbiter show --device sm_90 --op matmul "
            "CACHE</code> lists them all") in group
    due = section(html, "due")
    assert "4 entries: the next" in due and "first 3 of 4 due entries" in due
    ids = set(re.findall(r'id="([^"]+)"', html))
    links = set(re.findall(r'href="#([^"]+)"', html))
    assert "g-0" in links and links <= ids, links - ids


def test_hostile_names_are_text_and_nothing_loads(tmp_path: Path) -> None:
    _, html = render(tmp_path)
    assert "<img" not in html and "<b>" not in html and "\x1b" not in html and "<script" not in html
    assert "&lt;img src=x onerror=alert(1)&gt;\\x1b[31m" in html
    assert "test_odd[&lt;b&gt;bold&lt;/b&gt;&amp;amp;]" in html.replace("<wbr>", "")
    assert not re.search(r"<link|@import|url\((?!#)", html)
    tags = Tags()
    tags.feed(html)
    assert tags.elements >= {"html", "svg", "table", "a"}
    assert {"script", "img", "iframe", "object", "embed", "link"}.isdisjoint(tags.elements)
    assert tags.loads == [], "an attribute that would load something"
    ids = re.findall(r' id="([^"]+)"', html)
    assert len(ids) == len(set(ids))


class Tags(HTMLParser):
    """Every element of a page, and every attribute that would load or run something."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: set[str] = set()
        self.loads: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.add(tag)
        for name, value in attrs:
            if (name == "src" or name.startswith("on")
                    or (name.endswith("href") and not (value or "").startswith("#"))):
                self.loads.append((name, value or ""))


# -- a user op's labels ---------------------------------------------------------------------

USER_DTYPES = ("float32,float32,float32,py_float", "float32,float32,float64,py_float",
               "bfloat16,float32,int64,bool,py_int", "float64")
"""A user op's key dtypes: each input's when they differ (``inputs_label``)."""
LONG_BUCKET = "x".join(["256"] * 12) + "/a" + ".".join(["16"] * 12) + "/r3.3.3.3"
USER_BUCKETS = ("64x64x64x64x64/a16.16.16.16.16/r2.2.1.0",
                "128x128x128x64x64/a16.16.16.8.8/r2.2.1.0",
                "512x256x256x512x512/a16.16.16.16.16/r2.2.1.0", "a2.1-b3.2", LONG_BUCKET)
"""Shape buckets of a user op: every input's dimensions, alignments and ranks."""


def render_user_op(tmp_path: Path) -> Path:
    """The page of a user op with four inputs, its winners' names short (narrow
    columns under long dtypes: the case where labels met)."""
    pytest.importorskip("matplotlib")
    cache = tmp_path / "user.json"
    artifacts.write_cache(cache, MeasureCache([
        entry("cpu-x86_64", bucket, ("np", 8000.0 * (i + 1)), ("blas", 9100.0 * (i + 1)),
              op="scaled_matmul", dtype=dtype, confidence=0.9 if dtype == "float64" else 0.999)
        for i, bucket in enumerate(USER_BUCKETS) for dtype in USER_DTYPES]))
    page = tmp_path / "user.html"
    out = io.StringIO()
    assert main(["report", str(cache), "-o", str(page)], out=out) == 0, out.getvalue()
    return page


def test_a_user_ops_axis_labels_never_meet(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    figures: list[Any] = []
    draw = report_heatmap.svg_of

    def kept(fig: Any) -> str:
        figures.append(fig)
        return draw(fig)

    monkeypatch.setattr(report_heatmap, "svg_of", kept)
    html = render_user_op(tmp_path).read_text(encoding="utf-8")
    (fig,) = figures
    (ax,) = fig.axes
    labels = [t for t in [*ax.get_xticklabels(), *ax.get_yticklabels()] if t.get_text()]
    assert len(labels) == len(USER_DTYPES) + len(USER_BUCKETS)
    fig.draw_without_rendering()
    boxes = [t.get_window_extent() for t in labels]
    for (a, box_a), (b, box_b) in itertools.combinations(zip(labels, boxes, strict=True), 2):
        assert not box_a.overlaps(box_b), (a.get_text(), b.get_text())
    assert all(t.get_fontsize() * 96 / 72 >= 10 for t in labels)  # pt to CSS px
    # the dtypes whole, on lines; the longest bucket cut, whole in the table
    shown = [t.get_text().replace("\n", "") for t in ax.get_xticklabels()]
    assert shown == sorted(USER_DTYPES)
    rows = [t.get_text() for t in ax.get_yticklabels()]
    (long,) = [r for r in rows if r.endswith("...")]
    assert LONG_BUCKET.startswith(long.replace("\n", "")[:-3])
    assert f"<td>{breakable(LONG_BUCKET)}</td>" in html
    assert f"<title>{LONG_BUCKET}</title>" in html  # and on hover


def test_a_heat_map_is_drawn_once_in_the_box_a_tight_save_gives(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The figure's box is measured without drawing the cells (they lie inside the
    axes): each heat map is drawn once, not twice as ``bbox_inches="tight"`` does, and
    its size is the size a tight save gives."""
    from matplotlib.figure import Figure

    figures: list[Any] = []
    draws: list[Any] = []
    real_draw, real_svg = Figure.draw, report_heatmap.svg_of

    def counted(self: Any, renderer: Any) -> None:
        draws.append(self)
        real_draw(self, renderer)

    def kept(fig: Any) -> str:
        figures.append(fig)
        return real_svg(fig)

    monkeypatch.setattr(Figure, "draw", counted)
    monkeypatch.setattr(report_heatmap, "svg_of", kept)
    once = render_user_op(tmp_path).read_text(encoding="utf-8")
    assert len(figures) == 1 and draws == figures
    mpl = report_heatmap.matplotlib()
    with mpl.rc_context(report_heatmap.RC):
        tight = io.StringIO()
        figures[0].savefig(tight, format="svg", bbox_inches="tight",
                           pad_inches=report_heatmap.PAD_INCHES)
    size = re.compile(r'<svg [^>]*width="([^"]+)" height="([^"]+)"')
    assert size.search(once).groups() == size.search(tight.getvalue()).groups()


def test_labels_and_keys_break_where_a_reader_expects() -> None:
    assert wrap_label("float32,int64,py_float", 14) == "float32,int64,\npy_float"
    assert wrap_label("a2.1-b3.2", 5) == "a2.1-\nb3.2"
    assert wrap_label("512x256x256x512x512/a16.16.16.16.16/r2.2.1.0", 22) == (
        "512x256x256x512x512/\na16.16.16.16.16/\nr2.2.1.0")
    assert wrap_label("float64", 20) == "float64"
    assert wrap_label("abcdefghij", 4) == "abcd\nefgh\nij"  # nowhere to break
    assert wrap_label("ab,cd,ef,gh,ij,kl", 3, max_lines=2) == "ab,\n..."
    assert all(len(line) <= 7 for line in wrap_label(LONG_BUCKET, 7).split("\n"))
    # in a table: after slashes and commas, inside a long part between dimensions
    # (an x or a dot between digits), never inside a name (tests/cli/test_report_problems)
    assert breakable("64x64/a16.8/r2,<b>") == "64x64/<wbr>a16.8/<wbr>r2,<wbr>&lt;b&gt;"
    assert breakable("x" * 30 + "'") == "x" * 30 + "&#x27;"
    assert "<wbr>256x<wbr>256x<wbr>" in breakable(LONG_BUCKET)
    assert when("2026-12-05T14:27:01Z") == (
        '<span class="nowrap">2026-12-05T</span><wbr><span class="nowrap">14:27:01Z</span>')


# -- in Chromium ----------------------------------------------------------------------------

OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('.scroll, figure')) continue;  // a box that scrolls on its own
    const r = el.getBoundingClientRect();
    if (r.width && (r.right > width + 1 || r.left < -1))
      out.push(el.tagName + ' ' + (el.id || el.className) + ' ' + r.left + '..' + r.right);
  }
  return out;
}"""
BOXES = """() => Array.from(document.querySelectorAll('.scroll, figure')).map(el => ({
  right: el.getBoundingClientRect().right, overflow: getComputedStyle(el).overflowX,
  wide: el.scrollWidth > el.clientWidth}))"""
SMALL_TEXT = """() => {
  const out = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const node = walk.currentNode, el = node.parentElement;
    if (!node.textContent.trim() || el.closest('title')) continue;
    const range = document.createRange(); range.selectNodeContents(node);
    const r = range.getBoundingClientRect();
    const size = el instanceof SVGElement ? r.height : parseFloat(getComputedStyle(el).fontSize);
    if (r.height && size < 10) out.push(node.textContent.slice(0, 40) + ' ' + size);
  }
  return out;
}"""


@needs_chromium
@pytest.mark.slow
def test_the_page_in_chromium_at_desktop_and_phone_width(tmp_path: Path) -> None:
    page_file, _ = render(tmp_path)
    with chromium_page(1280, 900) as page:
        _check_in(page, page_file, tmp_path)


def _check_in(page: Any, page_file: Path, tmp_path: Path) -> None:
    said: list[str] = []
    requests: list[str] = []
    page.on("console", lambda msg: said.append(msg.text))
    page.on("pageerror", lambda exc: said.append(str(exc)))
    page.on("request", lambda req: requests.append(req.url))
    page.goto(page_file.as_uri())
    assert requests == [page_file.as_uri()] and said == []
    # what a person reads, as text
    header = page.locator("header").inner_text()
    assert "Generated" in header and "corpus.json" in header and "numpy 2.1.0" in header
    assert "sm_90 (GPU sm_90): 3 entries" in header
    problems = page.locator("#problems").inner_text()
    assert "tests.test_mm::test_ragged[7]" in problems
    assert "failed the F4 gate: max error 3e-2 " + SHOWN_HOSTILE in problems
    heat = page.locator("#g-1 figure")
    assert heat.is_visible()
    cells = heat.locator("svg text").evaluate_all("els => els.map(e => e.textContent)")
    for want in ("wmma", "1.00 \u00b5s", "low confidence", "stale"):
        assert any(want in t for t in cells), (want, cells)
    assert page.locator("#e-1.flagged, tr.flagged").count() >= 2
    assert "5.20 \u00b5s" in page.locator("#g-1 table.entries").inner_text()
    assert page.locator("#devices table").is_visible()
    assert page.locator("#scale .swatch").count() == len(SCALE) + 2
    page.screenshot(path=str(tmp_path / "desktop.png"), full_page=True)
    assert page.evaluate(SMALL_TEXT) == []

    page.set_viewport_size({"width": 390, "height": 844})
    page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)
    width = page.evaluate("document.scrollingElement.scrollWidth")
    assert width <= page.evaluate("document.scrollingElement.clientWidth"), width
    assert page.evaluate(OVERFLOW) == []
    boxes = page.evaluate(BOXES)
    assert boxes and all(b["right"] <= 391 and b["overflow"] == "auto" for b in boxes)
    assert any(b["wide"] for b in boxes)  # the wide tables scroll inside their box
    assert page.evaluate(SMALL_TEXT) == []
    assert page.locator("header").is_visible() and page.locator("#problems").is_visible()
    assert (tmp_path / "phone.png").stat().st_size > 10_000


TICK_LABELS = """() => Array.from(document.querySelectorAll('figure')).map(fig =>
  Array.from(fig.querySelectorAll('g[id*="tick_"]')).map(tick => {
    const lines = Array.from(tick.querySelectorAll('text'));
    const r = lines.map(t => t.getBoundingClientRect());
    return {text: lines.map(t => t.textContent).join(''),
            left: Math.min(...r.map(b => b.left)), right: Math.max(...r.map(b => b.right)),
            top: Math.min(...r.map(b => b.top)), bottom: Math.max(...r.map(b => b.bottom))};
  }).filter(label => label.text))"""
FIRST_CELL = """() => Array.from(document.querySelectorAll('figure')).map(fig => ({
  box: fig.getBoundingClientRect().right,
  cell: fig.querySelector('g[id$="-cell-0"]').getBoundingClientRect().left}))"""


@needs_chromium
@pytest.mark.slow
def test_a_user_ops_heat_map_in_chromium(tmp_path: Path) -> None:
    """Long multi-input dtypes and buckets: at desktop and phone width no two axis labels
    meet, none is under 10 px, nothing leaves the viewport, and a phone shows cells
    beside the bucket labels without scrolling."""
    page_file = render_user_op(tmp_path)
    with chromium_page(1280, 900) as page:
        page.goto(page_file.as_uri())
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 900})
            page.screenshot(path=str(tmp_path / f"user-op-{width}.png"), full_page=True)
            (labels,) = page.evaluate(TICK_LABELS)
            assert len(labels) == len(USER_DTYPES) + len(USER_BUCKETS)
            for a, b in itertools.combinations(labels, 2):
                assert not _meet(a, b), (width, a, b)
            assert page.evaluate(SMALL_TEXT) == []
            assert page.evaluate(OVERFLOW) == []
            assert all(b["right"] <= width + 1 for b in page.evaluate(BOXES))
            (first,) = page.evaluate(FIRST_CELL)
            assert first["cell"] + 40 <= first["box"], first  # a cell in view
            # keys, buckets and dtypes wrap between their parts: the tables of
            # entries due fits a phone, the table of entries a desktop
            fits = "el => el.scrollWidth <= el.clientWidth"
            assert page.locator("#due .scroll").evaluate(fits), width
            if width == 1280:
                assert page.locator(".group .scroll").evaluate(fits)



def _meet(a: Mapping[str, float], b: Mapping[str, float]) -> bool:
    return (a["left"] < b["right"] and b["left"] < a["right"]
            and a["top"] < b["bottom"] and b["top"] < a["bottom"])
