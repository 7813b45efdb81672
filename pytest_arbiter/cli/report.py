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
from collections.abc import Iterator, Mapping, Sequence
from operator import attrgetter, itemgetter
from typing import Any

from pytest_arbiter.cli import report_problems
from pytest_arbiter.cli.report_cells import (
    ALONE,
    SCALE,
    Marks,
    StaleKey,
    breakable,
    cut,
    due_for_remeasurement,
    key_text,
    latency,
    marks,
    natural,
    natural_keys,
    ratio,
    speedup,
    text,
    when,
)
from pytest_arbiter.cli.report_git import changed_since_commit, last_commit
from pytest_arbiter.cli.report_heatmap import (
    MAX_ROWS_PLOTTED,
    NAME_WIDTH,
    HeatMap,
    heatmap_svg,
    matplotlib,
)
from pytest_arbiter.cli.report_problems import HistogramInput
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, CacheKey, MeasureCache
from pytest_arbiter.store.safetext import counted, escape

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
td.reason { min-width: 16em; max-width: 28em; }
td.tests, td.keys { min-width: 12em; max-width: 20em; overflow-wrap: normal;
  word-break: keep-all; }
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


def _header_rows(found: _Corpus, corpus: str | None, inputs: Sequence[HistogramInput],
                 now: datetime.datetime) -> list[tuple[str, str]]:
    versions: dict[str, set[str]] = {}
    hosts: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    for device, run in found.runs:
        for name, value in (run.get("versions") or {}).items():
            versions.setdefault(name, set()).add(str(value))
        hosts.setdefault(run.get("host") or "not recorded", set()).add(device)
        names.setdefault(device, set()).add(run.get("device_name") or "")
    counts: dict[str, int] = {}
    for (device, _), group in found.groups.items():
        counts[device] = counts.get(device, 0) + group.count
    devices = "; ".join(
        text(d) + "".join(f" ({text(n)})" for n in sorted(names[d]) if n)
        + f": {counted(counts[d], 'entry', 'entries')}"
        for d in sorted(names))
    first, last = found.dates
    return [
        ("Generated", now.strftime("%Y-%m-%d %H:%M UTC")),
        ("Corpus", (text(corpus) if corpus else "-")
         + f" ({counted(found.count, 'entry', 'entries')})"),
        ("Commit", _commit(corpus)),
        ("Measured", f"{text(first)} to {text(last)}" if first else "not recorded"),
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


def _due(rows: Sequence[CacheEntry], due: int, anchors: Mapping[CacheKey, str]
         ) -> list[str]:
    """The due entries' section: ``rows``, the first due entries in the page's order, of
    ``due``."""
    lines = [f'<tr><td><a href="#{anchors[e.key]}">{breakable(key_text(e))}</a></td>'
             f"{cell(e.winner)}{cell(due_for_remeasurement(e))}</tr>"
             for e in rows[:MAX_TABLE_ROWS]]
    out = ['<section id="due"><h2>Due for re-measurement</h2>']
    if not lines:
        out.append('<p class="ok">No entry.</p>')
        return [*out, "</section>"]
    whose, them = ("its", "it") if due == 1 else ("their", "them")
    out.append(f"<p>{counted(due, 'entry', 'entries')}: the next <code>pytest "
               f"--arbiter-tune</code> on {whose} device measures {them} again.</p>")
    return [*out, *table(["key", "winner", "why"], lines, "due"),
            *_cut_note(len(lines), due, "due entries", "pytest-arbiter show CACHE"),
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


def _group(device: str, op: str, anchor: str, group: _Group,
           anchors: Mapping[CacheKey, str], stale: set[StaleKey]) -> list[str]:
    out = [f'<section class="group" id="{anchor}">'
           f"<h2>{text(device)} \u00b7 {text(op)}</h2>"]
    shapes = len({bucket for bucket, _ in group.cells})
    if shapes > MAX_ROWS_PLOTTED:
        out.append(f"<p>The heat map shows the first {MAX_ROWS_PLOTTED} of {shapes} "
                   "shapes; the table lists them all.</p>")
    out.append(f'<figure class="heatmap">{heatmap_svg(group.heat(), anchor, anchors, stale)}'
               "</figure>")
    rows = [_entry_row(e, anchors[e.key], stale) for e in group.rows()[:MAX_TABLE_ROWS]]
    where = f"pytest-arbiter show --device {device} --op {op} CACHE"
    return [*out, *table(ENTRY_COLUMNS, rows, "entries"),
            *_cut_note(len(rows), group.count, "entries", text(where)), "</section>"]


def _devices(found: _Corpus, anchors: Mapping[CacheKey, str]) -> list[str]:
    devices = sorted({device for device, _ in found.groups})
    # as the page lists entries: a key in its first device's place (bucket ties)
    keys = sorted(found.shared, key=lambda k: (k[0], k[1], natural(k[2]), k[3],
                                               min(d for d, _, _ in found.shared[k]), k[2]))
    out = ['<section id="devices"><h2>Devices side by side</h2>']
    if not keys:
        out.append(f"<p>No key was measured on more than one device "
                   f"({counted(len(devices), 'device')} in the corpus).</p>")
        return [*out, "</section>"]
    out.append(f"<p>{counted(len(keys), 'key')} measured on more than one device: each "
               "device's winner and median, and how much slower than the fastest device "
               "for the key.</p>")
    rows = []
    for key in keys[:MAX_TABLE_ROWS]:
        found_on = {device: (winner, median) for device, winner, median in found.shared[key]}
        best = min(median for _, median in found_on.values())
        cells = [f"<td>{breakable('/'.join(key))}</td>"]
        for device in devices:
            there = found_on.get(device)
            if there is None:
                cells.append("<td>-</td>")
                continue
            winner, median = there
            slower = "fastest" if median == best else f"{median / best:.2f}x"
            link = anchors[CacheKey(device, *key)]
            cells.append(f'<td><a href="#{link}">{text(winner)}</a> '
                         f"{text(latency(median))} ({slower})</td>")
        same = len({winner for winner, _ in found_on.values()}) == 1
        rows.append("<tr>" + "".join(cells) + cell("same" if same else "differs") + "</tr>")
    header = ["target/op/bucket/dtype", *(text(d) for d in devices), "winner"]
    return [*out, *table(header, rows, "devices"),
            *_cut_note(len(rows), len(keys), "keys", "pytest-arbiter show --wide CACHE"),
            "</section>"]


MAX_TABLE_ROWS = 1000
"""Rows a table of the page lists at most (a group's entries, the due entries, the keys
of several devices): a page of a million rows is no page a browser opens; ``show``
lists every entry."""


class _Anchors(Mapping[CacheKey, str]):
    """Where a link to an entry goes: its row, or its group's section when its group's
    table is cut (:data:`MAX_TABLE_ROWS`)."""

    def __init__(self, rows: dict[CacheKey, str], groups: dict[tuple[str, str], str]
                 ) -> None:
        self.rows, self.groups = rows, groups

    def __getitem__(self, key: CacheKey) -> str:
        found = self.rows.get(key)
        return self.groups[(key[0], key[2])] if found is None else found

    def __contains__(self, key: object) -> bool:
        return key in self.rows or (isinstance(key, tuple) and len(key) == 5
                                    and (key[0], key[2]) in self.groups)

    def __iter__(self) -> Iterator[CacheKey]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _anchors(found: _Corpus, named: Sequence[tuple[str, str, str]]) -> _Anchors:
    rows: dict[CacheKey, str] = {}
    for device, op, _ in named:
        for e in found.groups[(device, op)].rows()[:MAX_TABLE_ROWS]:
            rows[e.key] = f"e-{len(rows)}"
    return _Anchors(rows, {(device, op): anchor for device, op, anchor in named})


def _cut_note(shown: int, total: int, what: str, where: str) -> list[str]:
    """The line under a table cut at :data:`MAX_TABLE_ROWS`, saying what lists the rest."""
    if shown >= total:
        return []
    return [f'<p class="cut">The table lists the first {shown:,} of {total:,} {what}; '
            f"<code>{where}</code> lists them all.</p>"]


_Item = tuple[str, str, str, str, CacheEntry]
"""An entry of a group in the page's order: its bucket's natural key
(:func:`~pytest_arbiter.cli.report_cells.natural_keys`), dtype, target, bucket."""
_ORDER = itemgetter(0, 1, 2, 3)


class _First:
    """The first ``size`` of the entries given, in the page's order, and every entry of
    the first ``buckets`` shape buckets: only those are kept, so a big group is never
    all in memory. An entry whose natural key is past :attr:`limit` cannot be among
    them (``None``: any may)."""

    def __init__(self, size: int, buckets: int = 0) -> None:
        self.size, self.buckets = size, buckets
        self.items: list[_Item] = []
        self.limit: str | None = None
        self.room = 4 * size + 256
        """How many entries are held before the next prune."""

    def add(self, item: _Item) -> None:
        self.items.append(item)
        if len(self.items) >= self.room:
            self.prune()

    def prune(self) -> list[_Item]:
        """The entries kept, in the page's order."""
        items = sorted(self.items, key=_ORDER)
        kept = items[:self.size]
        limit = kept[-1][0] if kept and len(items) >= self.size else None
        if self.buckets:
            pairs = sorted({(item[0], item[3]) for item in items})
            if len(pairs) > self.buckets:
                last = pairs[self.buckets - 1]
                kept = [item for n, item in enumerate(items)
                        if n < self.size or (item[0], item[3]) <= last]
                limit = None if limit is None else max(limit, last[0])
            else:  # every bucket is one the heat map draws: every entry is kept
                kept, limit = items, None
        self.items, self.limit = kept, limit
        self.room = max(4 * self.size + 256, 2 * len(kept))  # a prune a doubling at most
        return kept


_WORDS = {(low, stale, tie): Marks(low, "stale" if stale else None, tie).words()
          for low in (False, True) for stale in (False, True) for tie in (False, True)}
_WIDTH_OF_WORDS = {flags: len(", ".join(words)) for flags, words in _WORDS.items()}
LATENCY_WIDTH = 8
"""The most characters :func:`~pytest_arbiter.cli.report_cells.latency` writes for a
median under 1000 s (``100.0 ms``)."""


class _Group:
    """What the page shows of one device and op: how many entries, the widest text of
    each heat map cell (of its last entry in the page's order, as drawn), the first
    entries and the first due ones."""

    def __init__(self) -> None:
        self.count = 0
        self.cells: dict[tuple[str, str], int] = {}
        """(bucket, dtype): the longest line of the cell's text, twice, plus one for
        three lines."""
        self.first = _First(MAX_TABLE_ROWS, MAX_ROWS_PLOTTED)
        self.due = _First(MAX_TABLE_ROWS)
        self.due_count = 0

    def rows(self) -> list[CacheEntry]:
        return [item[4] for item in self.first.prune()[:MAX_TABLE_ROWS]]

    def due_rows(self) -> list[CacheEntry]:
        return [item[4] for item in self.due.prune()]

    def heat(self) -> HeatMap:
        items = self.first.prune()
        buckets = sorted({(item[0], item[3]) for item in items})[:MAX_ROWS_PLOTTED]
        drawn = {bucket for _, bucket in buckets}
        cells = {(item[3], item[1]): item[4] for item in items if item[3] in drawn}
        return HeatMap([bucket for _, bucket in buckets],
                       sorted({dtype for _, dtype in self.cells}), cells,
                       max(self.cells.values()) // 2,
                       any(code & 1 for code in self.cells.values()))


class _Corpus:
    """What the page says of a corpus, taken in a block of entries at a time in any
    order: of the entries, only those the page shows are kept; besides them, a small
    record per key (its device, op, bucket and dtype, for the devices table and the heat
    maps' cells), so memory grows with the keys, not with what an entry holds."""

    def __init__(self, histograms: Sequence[HistogramInput]) -> None:
        self.histograms = histograms
        self.stale = report_problems.stale_keys(histograms)
        self.problems = report_problems.Problems(histograms)
        self.count = 0
        self.groups: dict[tuple[str, str], _Group] = {}
        self.runs: set[tuple[str, Any]] = set()
        self.dates: tuple[str, str] = ("", "")
        self.seen: dict[tuple[str, str, str, str], tuple[str, str, float]] = {}
        """A key without its device: the first device's, its winner and median."""
        self.shared: dict[tuple[str, str, str, str], list[tuple[str, str, float]]] = {}
        """The keys of more than one device: each device's, its winner and median."""
        self.widths: dict[str, int] = {}

    def clear(self) -> None:
        self.__init__(self.histograms)  # type: ignore[misc]

    def add(self, block: Sequence[CacheEntry]) -> None:
        self.count += len(block)
        self.runs.update(zip(map(_DEVICE, block), map(_RUN, block), strict=True))
        dates = [d for d in map(_MEASURED, block) if d]
        if dates:
            first, last = self.dates
            self.dates = (min(first or dates[0], *dates), max(last, *dates))
        for e, nk in zip(block, natural_keys(list(map(_BUCKET, block))), strict=True):
            self._take(e, nk)

    def _take(self, e: CacheEntry, nk: str) -> None:
        device, target, op, bucket, dtype = _KEY(e)
        group = self.groups.get((device, op))
        if group is None:
            group = self.groups[(device, op)] = _Group()
        group.count += 1
        item = (nk, dtype, target, bucket, e)
        limit = group.first.limit
        if limit is None or nk <= limit:
            group.first.add(item)
        low = e.low_confidence
        reverify = e.reverify
        if reverify or low or not e.considered:
            group.due_count += 1
            limit = group.due.limit
            if limit is None or nk <= limit:
                group.due.add(item)
        key = (target, op, bucket, dtype)
        flags = (low, reverify or key in self.stale, e.tie)
        best = e.ranking[0]
        winner, median = best.name, best.stats.median_ns
        width = self.widths.get(winner)
        if width is None:
            width = self.widths[winner] = len(cut(escape(winner), NAME_WIDTH))
        words = _WIDTH_OF_WORDS[flags]
        if words > width:
            width = words
        if width < LATENCY_WIDTH or median >= 1e12:
            width = max(width, len(latency(median)))
        group.cells[(bucket, dtype)] = 2 * width + any(flags)
        # the devices side by side: each key's first device, and the others of a key
        found = (device, winner, median)
        first = self.seen.setdefault(key, found)
        if first is not found:
            self.shared.setdefault(key, [first]).append(found)
        self.problems.add(e, nk)


_KEY = attrgetter("device", "target", "op", "bucket", "dtype")
_DEVICE = attrgetter("device")
_RUN = attrgetter("provenance.run")
_MEASURED = attrgetter("provenance.measured_at")
_BUCKET = attrgetter("bucket")


def render(cache: MeasureCache, histograms: Sequence[HistogramInput] = (),
           title: str = "pytest-arbiter report", corpus: str | None = None,
           now: datetime.datetime | None = None) -> str:
    """The whole page. ``ReportUnavailable`` when matplotlib is missing."""
    matplotlib()
    found = _Corpus(histograms)
    found.add(cache.entries())
    return _page(found, histograms, title, corpus, now)


def render_file(path: str | os.PathLike[str], histograms: Sequence[HistogramInput] = (),
                title: str = "pytest-arbiter report", corpus: str | None = None,
                now: datetime.datetime | None = None) -> tuple[str, int]:
    """The whole page of the cache file at ``path``, and how many entries it holds: the
    file is read a block at a time (:func:`pytest_arbiter.store.artifacts.each_block`),
    each block taken in and let go, so its entries are never all in memory.
    ``ReportUnavailable`` when matplotlib is missing, ``ArtifactError`` for a bad file."""
    matplotlib()
    found = _Corpus(histograms)
    artifacts.each_block(path, found.add, again=found.clear)
    return _page(found, histograms, title, corpus, now), found.count


def _page(found: _Corpus, histograms: Sequence[HistogramInput], title: str,
          corpus: str | None, now: datetime.datetime | None) -> str:
    stale = found.stale
    named = [(d, o, f"g-{n}") for n, (d, o) in enumerate(sorted(found.groups))]
    anchors = _anchors(found, named)
    when = now or datetime.datetime.now(datetime.timezone.utc)
    body = _header(title, _header_rows(found, corpus, histograms, when), named)
    body += _legend()
    body += report_problems.section(found.problems.rows(), histograms, anchors)
    due = [e for d, o, _ in named for e in found.groups[(d, o)].due_rows()]
    body += _due(due, sum(g.due_count for g in found.groups.values()), anchors)
    for device, op, anchor in named:
        body += _group(device, op, anchor, found.groups[(device, op)], anchors, stale)
    if not found.groups:
        body.append("<p>The cache holds no entries.</p>")
    body += _devices(found, anchors)
    return page(title, body)
