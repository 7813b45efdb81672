"""``pytest-arbiter report``: one self-contained HTML page about a corpus.

From the top: a header (when the page was made, the corpus file and the commit that
last changed it, the measurement dates, the versions and hosts the entries record, the
devices); the one colour scale of the page; the problem table
(:mod:`pytest_arbiter.cli.report_problems`); the entries due for re-measurement; per
device and op, a heat map (:mod:`pytest_arbiter.cli.report_heatmap`) and a table of
every entry with its median, confidence and marks; last, the devices side by side for
the keys measured on more than one.

Every name on the page comes from artifacts a runner wrote: each is escaped
(:func:`pytest_arbiter.cli.report_cells.text`); the page has no script and loads
nothing (its Content-Security-Policy says so). Narrow screens get one column; a wide
table or figure scrolls in its own box, never the page.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping, Sequence

from pytest_arbiter.cli import report_problems
from pytest_arbiter.cli.report_cells import (
    ALONE,
    SCALE,
    StaleKey,
    breakable,
    due_for_remeasurement,
    key_text,
    latency,
    marks,
    natural,
    ratio,
    speedup,
    text,
    when,
)
from pytest_arbiter.cli.report_git import changed_since_commit, last_commit
from pytest_arbiter.cli.report_heatmap import MAX_ROWS_PLOTTED, heatmap_svg, matplotlib
from pytest_arbiter.cli.report_problems import HistogramInput
from pytest_arbiter.store.cache import CacheEntry, CacheKey, MeasureCache

__all__ = ["HistogramInput", "page", "render"]

CSS = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; font-size: 16px; line-height: 1.4;
  margin: 0 auto; padding: 0.75em; max-width: 90em; color: #222; overflow-wrap: anywhere; }
h1 { font-size: 1.4em; margin: 0.2em 0; } h2 { font-size: 1.15em; margin-top: 1.6em; }
nav a { margin-right: 0.8em; display: inline-block; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 0.2em 1em; margin: 0.5em 0; }
dl.meta dt { font-weight: 600; } dl.meta dd { margin: 0; }
.scroll, figure { overflow-x: auto; max-width: 100%; margin: 0.5em 0 1em; }
table { border-collapse: collapse; font-size: 0.875em; overflow-wrap: normal; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums;
  white-space: nowrap; }
td.reason { min-width: 16em; max-width: 32em; } td.tests, td.keys { min-width: 12em; }
.nowrap { white-space: nowrap; }
tr.flagged td:first-child { border-left: 4px dashed #111; }
.bad { color: #a40000; font-weight: 600; } .ok { color: #216e00; }
.badge { font-weight: 600; white-space: nowrap; }
.mark { font-weight: 600; font-style: italic; white-space: nowrap; }
ul.scale { list-style: none; padding: 0; margin: 0.3em 0;
  display: flex; flex-wrap: wrap; gap: 0.3em 1em; font-size: 0.875em; }
.swatch { display: inline-block; width: 1.6em; height: 1em; vertical-align: middle;
  border: 1px solid #999; margin-right: 0.35em; }
.swatch.flagged { border: 2px dashed #111; background: #fff; }
figure svg { max-width: none; height: auto; display: block; }
@media (max-width: 40em) {
  body { padding: 0.5em; }
  dl.meta { grid-template-columns: 1fr; } dl.meta dd { margin-bottom: 0.4em; }
}
"""
CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src data:")
"""Nothing on the page may load from anywhere, and no script runs."""


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def page(title: str, body: Sequence[str]) -> str:
    """A whole page around ``body``: the head, the style, the policy."""
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        f"<title>{text(title)}</title><style>{CSS}</style></head><body>",
        *body, "</body></html>"]) + "\n"


def table(header: Sequence[str], rows: Sequence[str], cls: str) -> list[str]:
    """A table in its own scrolling box; ``rows`` are ``<tr>`` elements."""
    return [f'<div class="scroll"><table class="{cls}"><thead><tr>'
            + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead><tbody>",
            *rows, "</tbody></table></div>"]


def cell(value: object, num: bool = False) -> str:
    return f'<td class="num">{text(value)}</td>' if num else f"<td>{text(value)}</td>"


def _values(found: Mapping[str, set[str]]) -> str:
    if not found:
        return "not recorded"
    return "; ".join(f"{text(name)} {text(', '.join(sorted(v)))}"
                     for name, v in sorted(found.items()))


def _header_rows(entries: Sequence[CacheEntry], corpus: str | None,
                 inputs: Sequence[HistogramInput], now: datetime.datetime
                 ) -> list[tuple[str, str]]:
    versions: dict[str, set[str]] = {}
    hosts: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    for e in entries:
        for name, value in (e.provenance.run.get("versions") or {}).items():
            versions.setdefault(name, set()).add(str(value))
        hosts.setdefault(e.provenance.host or "not recorded", set()).add(e.device)
        names.setdefault(e.device, set()).add(e.provenance.device_name or "")
    counts = {d: sum(1 for e in entries if e.device == d) for d in names}
    devices = "; ".join(
        text(d) + "".join(f" ({text(n)})" for n in sorted(names[d]) if n)
        + f": {plural(counts[d], 'entry', 'entries')}"
        for d in sorted(names))
    dates = sorted(e.provenance.measured_at for e in entries if e.provenance.measured_at)
    return [
        ("Generated", now.strftime("%Y-%m-%d %H:%M UTC")),
        ("Corpus", (text(corpus) if corpus else "-")
         + f" ({plural(len(entries), 'entry', 'entries')})"),
        ("Commit", _commit(corpus)),
        ("Measured", f"{text(dates[0])} to {text(dates[-1])}" if dates else "not recorded"),
        ("Devices", devices or "none"),
        ("Versions", _values(versions)),
        ("Hosts", "; ".join(f"{text(h)}" for h in sorted(hosts)) or "none"),
        ("Reports", text(", ".join(h.source for h in inputs)) if inputs else "none given"),
    ]


def _commit(corpus: str | None) -> str:
    """The commit that last changed the corpus file, as the header says it."""
    if corpus is None or not os.path.exists(corpus):
        return "-"
    found = last_commit(corpus)
    if found is None:
        return "not committed (or not in a git repository)"
    return (text(found.describe())
            + (" (the file has changed since)" if changed_since_commit(corpus) else ""))


def _header(title: str, rows: Sequence[tuple[str, str]],
            groups: Sequence[tuple[str, str, str]]) -> list[str]:
    links = [("#problems", "Problems"), ("#due", "Due for re-measurement"),
             *((f"#{anchor}", f"{text(d)} \u00b7 {text(o)}") for d, o, anchor in groups),
             ("#devices", "Devices side by side")]
    return (["<header>", f"<h1>{text(title)}</h1>", '<dl class="meta">']
            + [f"<dt>{name}</dt><dd>{value}</dd>" for name, value in rows]
            + ["</dl>", "<nav>" + "".join(f'<a href="{href}">{label}</a>'
                                          for href, label in links) + "</nav>",
               "</header>"])


def _legend() -> list[str]:
    steps = [f'<li><span class="swatch" style="background:{b.colour}"></span>'
             f"{text(b.label)}</li>" for b in (*SCALE, ALONE)]
    return ['<section id="scale"><h2>How to read the heat maps</h2>',
            "<p>Each cell is one shape bucket and dtype of a device and op: the winner's "
            "name and median latency. Its colour is how much faster the winner measured "
            "than the runner-up timed with it (the runner-up's paired ratio to the winner), "
            "on one scale for the whole page. Hover a cell for the ranking; select it for "
            "its row in the table.</p>",
            '<ul class="scale">', *steps,
            '<li><span class="swatch flagged"></span>dashed frame: <span class="mark">low '
            'confidence</span> (too little evidence for the pick) or <span class="mark">'
            "stale</span> (to be measured again), also written in the cell</li>",
            "</ul></section>"]


def _due(entries: Sequence[CacheEntry], anchors: Mapping[CacheKey, str]) -> list[str]:
    rows = []
    due = 0
    for e in entries:
        why = due_for_remeasurement(e)
        if why is not None:
            due += 1
            if due > MAX_TABLE_ROWS:
                continue
            key = breakable(key_text(e))
            rows.append(f'<tr><td><a href="#{anchors[e.key]}">{key}</a></td>'
                        f"{cell(e.winner)}{cell(why)}</tr>")
    out = ['<section id="due"><h2>Due for re-measurement</h2>']
    if not rows:
        out.append('<p class="ok">No entry.</p>')
        return [*out, "</section>"]
    whose, them = ("its", "it") if due == 1 else ("their", "them")
    out.append(f"<p>{plural(due, 'entry', 'entries')}: the next <code>pytest "
               f"--arbiter-tune</code> on {whose} device measures {them} again.</p>")
    return [*out, *table(["key", "winner", "why"], rows, "due"),
            *_cut_note(len(rows), due, "due entries", "pytest-arbiter show CACHE"),
            "</section>"]


def _entry_row(e: CacheEntry, anchor: str, stale: set[StaleKey]) -> str:
    s = speedup(e)
    m = marks(e, stale)
    runner = e.ranking[1] if len(e.ranking) > 1 else None
    words = ", ".join(m.words())
    flagged = ' class="flagged"' if m.flagged else ""
    return (f'<tr id="{anchor}"{flagged}>'
            + f"<td>{breakable(e.bucket)}</td><td>{breakable(e.dtype)}</td>" + cell(e.winner)
            + cell(latency(e.ranking[0].stats.median_ns), num=True)
            + cell("-" if runner is None else runner.name
                   + (" (carried)" if runner.carried else ""))
            + cell(ratio(s.runner_up), num=True) + cell(ratio(s.slowest), num=True)
            + cell(f"{e.confidence:.3f}", num=True)
            + (f'<td class="mark">{text(words)}</td>' if words else "<td>-</td>")
            + cell(f"{e.spread * 100:.1f}%", num=True) + cell(e.samples, num=True)
            + cell(len(e.ranking), num=True) + f"<td>{when(e.provenance.measured_at)}</td>"
            + "</tr>")


ENTRY_COLUMNS = ["bucket", "dtype", "winner", "median", "runner-up", "over runner-up",
                 "over slowest", "confidence", "marks", "spread", "samples", "timed",
                 "measured"]


def _group(device: str, op: str, anchor: str, group: Sequence[CacheEntry],
           anchors: Mapping[CacheKey, str], stale: set[StaleKey]) -> list[str]:
    out = [f'<section class="group" id="{anchor}">'
           f"<h2>{text(device)} \u00b7 {text(op)}</h2>"]
    shapes = len({e.bucket for e in group})
    if shapes > MAX_ROWS_PLOTTED:
        out.append(f"<p>The heat map shows the first {MAX_ROWS_PLOTTED} of {shapes} "
                   "shapes; the table lists them all.</p>")
    out.append(f'<figure class="heatmap">{heatmap_svg(group, anchor, anchors, stale)}'
               "</figure>")
    rows = [_entry_row(e, anchors[e.key], stale) for e in group[:MAX_TABLE_ROWS]]
    where = f"pytest-arbiter show --device {device} --op {op} CACHE"
    return [*out, *table(ENTRY_COLUMNS, rows, "entries"),
            *_cut_note(len(rows), len(group), "entries", text(where)), "</section>"]


def _devices(entries: Sequence[CacheEntry], anchors: Mapping[CacheKey, str]) -> list[str]:
    devices = sorted({e.device for e in entries})
    shared: dict[tuple[str, str, str, str], dict[str, CacheEntry]] = {}
    for e in entries:
        shared.setdefault((e.target, e.op, e.bucket, e.dtype), {})[e.device] = e
    keys = sorted((k for k, found in shared.items() if len(found) > 1),
                  key=lambda k: (k[0], k[1], natural(k[2]), k[3]))
    out = ['<section id="devices"><h2>Devices side by side</h2>']
    if not keys:
        out.append(f"<p>No key was measured on more than one device "
                   f"({plural(len(devices), 'device')} in the corpus).</p>")
        return [*out, "</section>"]
    out.append(f"<p>{plural(len(keys), 'key')} measured on more than one device: each "
               "device's winner and median, and how much slower than the fastest device "
               "for the key.</p>")
    rows = []
    for key in keys[:MAX_TABLE_ROWS]:
        found = shared[key]
        best = min(e.ranking[0].stats.median_ns for e in found.values())
        cells = [f"<td>{breakable('/'.join(key))}</td>"]
        for device in devices:
            there = found.get(device)
            if there is None:
                cells.append("<td>-</td>")
                continue
            median = there.ranking[0].stats.median_ns
            slower = "fastest" if median == best else f"{median / best:.2f}x"
            cells.append(f'<td><a href="#{anchors[there.key]}">{text(there.winner)}</a> '
                         f"{text(latency(median))} ({slower})</td>")
        same = len({e.winner for e in found.values()}) == 1
        rows.append("<tr>" + "".join(cells) + cell("same" if same else "differs") + "</tr>")
    header = ["target/op/bucket/dtype", *(text(d) for d in devices), "winner"]
    return [*out, *table(header, rows, "devices"),
            *_cut_note(len(rows), len(keys), "keys", "pytest-arbiter show --wide CACHE"),
            "</section>"]


MAX_TABLE_ROWS = 1000
"""Rows a table of the page lists at most (a group's entries, the due entries, the keys
of several devices): a page of a million rows is no page a browser opens; ``show``
lists every entry."""


def _anchors(groups: Mapping[tuple[str, str], Sequence[CacheEntry]],
             named: Sequence[tuple[str, str, str]]) -> dict[CacheKey, str]:
    """Where a link to an entry goes: its row, or its group's section when its group's
    table is cut (:data:`MAX_TABLE_ROWS`)."""
    anchors: dict[CacheKey, str] = {}
    number = 0
    for device, op, anchor in named:
        group = groups[(device, op)]
        for e in group[:MAX_TABLE_ROWS]:
            anchors[e.key] = f"e-{number}"
            number += 1
        anchors.update((e.key, anchor) for e in group[MAX_TABLE_ROWS:])
    return anchors


def _cut_note(shown: int, total: int, what: str, where: str) -> list[str]:
    """The line under a table cut at :data:`MAX_TABLE_ROWS`, saying what lists the rest."""
    if shown >= total:
        return []
    return [f'<p class="cut">The table lists the first {shown:,} of {total:,} {what}; '
            f"<code>{where}</code> lists them all.</p>"]


def render(cache: MeasureCache, histograms: Sequence[HistogramInput] = (),
           title: str = "pytest-arbiter report", corpus: str | None = None,
           now: datetime.datetime | None = None) -> str:
    """The whole page. ``ReportUnavailable`` when matplotlib is missing."""
    matplotlib()
    entries = sorted(cache.entries(), key=lambda e: (e.device, e.op, natural(e.bucket),
                                                     e.dtype, e.target))
    stale = report_problems.stale_keys(histograms)
    groups: dict[tuple[str, str], list[CacheEntry]] = {}
    for e in entries:
        groups.setdefault((e.device, e.op), []).append(e)
    named = [(d, o, f"g-{n}") for n, (d, o) in enumerate(groups)]
    anchors = _anchors(groups, named)
    when = now or datetime.datetime.now(datetime.timezone.utc)
    body = _header(title, _header_rows(entries, corpus, histograms, when), named)
    body += _legend()
    body += report_problems.section(report_problems.problems(entries, histograms),
                                    histograms, anchors)
    body += _due(entries, anchors)
    for device, op, anchor in named:
        body += _group(device, op, anchor, groups[(device, op)], anchors, stale)
    if not groups:
        body.append("<p>The cache holds no entries.</p>")
    body += _devices(entries, anchors)
    return page(title, body)
