"""``pytest-arbiter report``: one self-contained HTML page about a corpus.

Per device and op, two heat maps of shape bucket by dtype, coloured by the winner's
speedup over the runner-up and over the slowest timed candidate (the winner's name on
hover, in each cell's SVG ``<title>``), and a table of every entry with its confidence
and spread. At the top: the dispatch histograms' degraded, rejected and error entries,
and the entries due for re-measurement. The plots are inline SVG drawn by matplotlib
(the optional ``report`` extra); the page loads nothing from anywhere.

Every name on the page comes from artifacts a runner wrote: each is escaped
(:func:`pytest_arbiter.store.safetext.escape`, then :func:`html.escape`), and matplotlib
draws them as plain text (no math parsing).
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_arbiter.errors import ReportUnavailable
from pytest_arbiter.gating.histogram import GATED_OUTCOMES, HistogramKey
from pytest_arbiter.store.cache import CacheEntry, MeasureCache
from pytest_arbiter.store.safetext import escape

INSTALL_HINT = "pip install 'pytest-arbiter[report]'"
MAX_ROWS_PLOTTED = 120
"""Shapes drawn per heat map; the table below it lists them all."""
MAX_ANNOTATED_CELLS = 400


def _text(value: object) -> str:
    """An artifact's string, safe inside HTML and SVG text and attributes."""
    return html.escape(escape(value), quote=True)


def _natural(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


@dataclass(frozen=True)
class Speedup:
    """How much faster the winner measured than the runner-up and than the slowest
    (``None`` when it was timed alone)."""

    runner_up: float | None
    slowest: float | None


def speedup(entry: CacheEntry) -> Speedup:
    best = entry.ranking[0].stats.median_ns
    # only rows timed side by side with the winner say how much slower they are
    medians = [r.stats.median_ns for r in entry.ranking[1:] if not r.carried]
    if not medians or best <= 0:
        return Speedup(None, None)
    return Speedup(medians[0] / best, max(medians) / best)


def due_for_remeasurement(entry: CacheEntry) -> str | None:
    """Why the entry should be measured again, or ``None``."""
    if entry.reverify:
        return "the environment changed since it was measured (reverify)"
    if not entry.considered:
        return "it does not record what it was measured against (no considered candidates)"
    if entry.low_confidence:
        return (f"low-confidence pick (confidence {entry.confidence:.3f}, "
                f"{entry.provenance.rounds or '?'} rounds): re-tune with a larger "
                "--arbiter-tune-budget")
    return None


@dataclass(frozen=True)
class HistogramInput:
    """A dispatch histogram file's counts, named by its path."""

    source: str
    counts: dict[HistogramKey, int]


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ReportUnavailable(f"the report needs matplotlib: {INSTALL_HINT}") from None
    matplotlib.use("svg", force=True)
    import matplotlib.pyplot

    return matplotlib


def _svg(fig: Any) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight",
                metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buffer.getvalue()
    # inline: no XML prolog or DOCTYPE (a DTD reference a browser would not need)
    return text[text.index("<svg"):]


def heatmap_svg(entries: Sequence[CacheEntry], prefix: str = "cell") -> str:
    """Two heat maps (over the runner-up, over the slowest) of ``entries`` (one device
    and op) as inline SVG; each cell's ``<title>`` names its key and winner. Cells get
    the ids ``PREFIX-N``: one prefix per figure of a page keeps its ids unique."""
    mpl = _matplotlib()
    plt = mpl.pyplot
    from matplotlib.colors import Normalize
    from matplotlib.patches import Rectangle

    buckets = sorted({e.bucket for e in entries}, key=_natural)[:MAX_ROWS_PLOTTED]
    dtypes = sorted({e.dtype for e in entries})
    by_cell = {(e.bucket, e.dtype): e for e in entries}
    speeds = {cell: speedup(e) for cell, e in by_cell.items()}
    values = [v for s in speeds.values() for v in (s.runner_up, s.slowest) if v is not None]
    top = max([*values, 1.1])
    norm = Normalize(vmin=min([*values, 1.0]), vmax=top)
    cmap = mpl.colormaps["YlGn"]
    annotate = len(buckets) * len(dtypes) <= MAX_ANNOTATED_CELLS
    titles: dict[str, str] = {}
    with mpl.rc_context({"svg.fonttype": "none", "text.parse_math": False,
                         "svg.hashsalt": "pytest-arbiter"}):
        fig, axes = plt.subplots(
            1, 2, squeeze=False,
            figsize=(2.2 + 1.6 * len(dtypes) * 2, 1.4 + 0.32 * len(buckets)))
        for ax, (label, pick) in zip(axes[0], (
                ("speedup over the runner-up", lambda s: s.runner_up),
                ("speedup over the slowest", lambda s: s.slowest)), strict=True):
            for row, bucket in enumerate(buckets):
                for col, dtype in enumerate(dtypes):
                    entry = by_cell.get((bucket, dtype))
                    if entry is None:
                        continue
                    value = pick(speeds[(bucket, dtype)])
                    gid = f"cell-{len(titles)}"
                    patch = Rectangle((col, row), 1, 1, edgecolor="white", linewidth=1,
                                      facecolor="#d9d9d9" if value is None
                                      else cmap(norm(value)))
                    patch.set_gid(gid)
                    ax.add_patch(patch)
                    shown = "timed alone" if value is None else f"{value:.2f}x"
                    titles[gid] = (f"{bucket} {dtype}: {entry.winner} ({label}: {shown}; "
                                   f"confidence {entry.confidence:.3f}"
                                   + (", tie" if entry.tie else "") + ")")
                    if annotate:
                        dark = value is not None and norm(value) > 0.6
                        ax.text(col + 0.5, row + 0.5,
                                "-" if value is None else f"{value:.2f}x",
                                ha="center", va="center", fontsize=7,
                                color="white" if dark else "black")
            ax.set_xlim(0, len(dtypes))
            ax.set_ylim(len(buckets), 0)
            ax.set_xticks([i + 0.5 for i in range(len(dtypes))],
                          [escape(d) for d in dtypes], rotation=30, ha="right")
            # the rows are the same in both maps: labelled once, on the left
            ax.set_yticks([i + 0.5 for i in range(len(buckets))],
                          [escape(b) for b in buckets] if ax is axes[0][0] else [],
                          fontsize=7)
            ax.set_title(label, fontsize=9)
            ax.tick_params(length=0)
        mappable = mpl.cm.ScalarMappable(norm=norm, cmap=cmap)
        fig.colorbar(mappable, ax=list(axes[0]), shrink=0.8, label="x faster")
        svg = _svg(fig)
        plt.close(fig)
    for gid, text in titles.items():
        svg = svg.replace(f'<g id="{gid}">', f'<g id="{gid}"><title>{_text(text)}</title>',
                          1)
    return _prefixed_ids(svg, prefix)


def _prefixed_ids(svg: str, prefix: str) -> str:
    """Every id of one figure (matplotlib numbers them from 1 in each) and every
    reference to one, prefixed: several figures on one page keep their ids apart."""
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    return re.sub(r'(url\(#|href="#)([^)"]+)',
                  lambda m: m.group(1) + (f"{prefix}-{m.group(2)}" if m.group(2) in ids
                                          else m.group(2)), svg)


CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 2em; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
th { background: #f2f2f2; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.bad { color: #a40000; font-weight: 600; } .ok { color: #216e00; }
figure { margin: 0.5em 0; overflow-x: auto; } svg { max-width: none; height: auto; }
"""


def _table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str) -> list[str]:
    out = [f'<table class="{cls}"><thead><tr>'
           + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(row) + "</tr>")
    out.append("</tbody></table>")
    return out


def _cell(value: object, num: bool = False) -> str:
    return f'<td class="num">{_text(value)}</td>' if num else f"<td>{_text(value)}</td>"


def _problems(histograms: Sequence[HistogramInput]) -> list[str]:
    rows = []
    for hist in histograms:
        for key, count in sorted(hist.counts.items()):
            if key.outcome in GATED_OUTCOMES and count > 0:
                target, op, selected, outcome = key
                rows.append([_cell(outcome), _cell(target), _cell(op), _cell(selected),
                             _cell(count, num=True), _cell(hist.source)])
    out = ['<section id="problems"><h2>Degraded, rejected and error dispatches</h2>']
    if not histograms:
        out.append("<p>No dispatch histogram was given.</p>")
    elif not rows:
        out.append(f'<p class="ok">None in {len(histograms)} histogram(s).</p>')
    else:
        out.append(f'<p class="bad">{len(rows)} entries.</p>')
        out += _table(["outcome", "target", "op", "candidate", "dispatches", "histogram"],
                      rows, "problems")
    out.append("</section>")
    return out


def _due(entries: Sequence[CacheEntry]) -> list[str]:
    rows = []
    for e in entries:
        why = due_for_remeasurement(e)
        if why is not None:
            rows.append([_cell(e.device), _cell(e.target), _cell(e.op), _cell(e.bucket),
                         _cell(e.dtype), _cell(e.winner), _cell(why)])
    out = ['<section id="due"><h2>Due for re-measurement</h2>']
    if not rows:
        out.append('<p class="ok">No entry.</p>')
    else:
        out.append(f"<p>{len(rows)} entries (the next <code>pytest --arbiter-tune</code> "
                   "on their device measures them again).</p>")
        out += _table(["device", "target", "op", "bucket", "dtype", "winner", "why"], rows,
                      "due")
    out.append("</section>")
    return out


def _entry_rows(entries: Sequence[CacheEntry]) -> list[list[str]]:
    rows = []
    for e in sorted(entries, key=lambda e: (_natural(e.bucket), e.dtype)):
        s = speedup(e)
        runner = e.ranking[1].name if len(e.ranking) > 1 else "-"
        rows.append([
            _cell(e.bucket), _cell(e.dtype), _cell(e.winner), _cell(runner),
            _cell("-" if s.runner_up is None else f"{s.runner_up:.2f}x", num=True),
            _cell("-" if s.slowest is None else f"{s.slowest:.2f}x", num=True),
            _cell(f"{e.confidence:.3f}" + (" tie" if e.tie else "")
                  + (" low" if e.low_confidence else ""), num=True),
            _cell(f"\u00b1{e.spread * 50:.1f}%", num=True),
            _cell(e.samples, num=True), _cell(len(e.ranking), num=True),
            _cell(e.provenance.measured_at or "-")])
    return rows


def render(cache: MeasureCache, histograms: Sequence[HistogramInput] = (),
           title: str = "pytest-arbiter report") -> str:
    """The whole page. ``ReportUnavailable`` when matplotlib is missing."""
    _matplotlib()
    entries = cache.entries()
    groups: dict[tuple[str, str], list[CacheEntry]] = {}
    for e in entries:
        groups.setdefault((e.device, e.op), []).append(e)
    devices = sorted({e.device for e in entries})
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           # nothing on the page may load from anywhere
           '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
           "style-src 'unsafe-inline'; img-src data:\">",
           f"<title>{_text(title)}</title><style>{CSS}</style></head><body>",
           f"<h1>{_text(title)}</h1>",
           f"<p>{len(entries)} entries on {len(devices)} device(s) "
           f"({_text(', '.join(devices))}), {len(groups)} device and op pair(s). Each cell "
           "is one shape bucket and dtype, coloured by how much faster the winner "
           "measured (median) than the runner-up and than the slowest timed candidate; "
           "hover a cell for the winner. Spread is half the interquartile range over "
           "the median.</p>"]
    out += _problems(histograms)
    out += _due(entries)
    for (device, op), group in sorted(groups.items()):
        anchor = f"g{len(out)}"
        out.append(f'<section class="group" id="{anchor}">'
                   f"<h2>{_text(device)} \u00b7 {_text(op)}</h2>")
        shapes = len({e.bucket for e in group})
        if shapes > MAX_ROWS_PLOTTED:
            out.append(f"<p>The heat maps show the first {MAX_ROWS_PLOTTED} of {shapes} "
                       "shapes; the table lists them all.</p>")
        out.append(f'<figure class="heatmap">{heatmap_svg(group, anchor)}'
                   "</figure>")
        out += _table(["bucket", "dtype", "winner", "runner-up", "over runner-up",
                       "over slowest", "confidence", "spread", "samples", "timed",
                       "measured"], _entry_rows(group), "entries")
        out.append("</section>")
    if not groups:
        out.append("<p>The cache holds no entries.</p>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
