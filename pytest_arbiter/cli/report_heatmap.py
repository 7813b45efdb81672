"""The heat map of one device and op in ``pytest-arbiter report``: shape bucket by dtype,
each cell the winner's name, its median with units and its marks in words, coloured on
the page's one scale (:data:`pytest_arbiter.cli.report_cells.SCALE`), its ranking on
hover (the SVG ``<title>``), a link to its row in the table below.

Drawn by matplotlib (the optional ``report`` extra) as inline SVG with real text (no
math parsing) at a fixed size: a phone scrolls the figure in its own box rather than
shrink its labels.
"""

from __future__ import annotations

import io
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_arbiter.cli.report_cells import (
    StaleKey,
    band,
    cut,
    latency,
    marks,
    ranking_text,
    ratio,
    speedup,
    text,
)
from pytest_arbiter.errors import ReportUnavailable
from pytest_arbiter.store.cache import CacheEntry, CacheKey
from pytest_arbiter.store.safetext import escape

INSTALL_HINT = "pip install 'pytest-arbiter[report]'"
MAX_ROWS_PLOTTED = 120
"""Shapes drawn per heat map; the table below it lists them all."""
MAX_ANNOTATED_CELLS = 400
NAME_WIDTH = 20
"""Characters of a winner's name written in its cell (all of it on hover)."""
FONT_PT = 9.0
"""12 px in a browser: the SVG is shown at its own size, never scaled down."""
CHAR_PT = 0.7 * FONT_PT
"""A generous average character width (the winner's name is bold)."""


def matplotlib() -> Any:
    """matplotlib, set up to draw SVG; ``ReportUnavailable`` when it is missing."""
    try:
        import matplotlib
    except ImportError:
        raise ReportUnavailable(f"the report needs matplotlib: {INSTALL_HINT}") from None
    matplotlib.use("svg", force=True)
    import matplotlib.pyplot

    return matplotlib


PAD_INCHES = 0.05
"""Room around what a figure draws."""
SVG_DPI = 72
"""The resolution matplotlib draws an SVG at, whatever the figure's."""


def svg_of(fig: Any) -> str:
    """The figure as inline SVG, cut to what it draws (its tight box, padded). The box
    is measured first, over the artists in the layout only (a heat map's cells, inside
    its axes, are not: :func:`heatmap_figure`), and the figure drawn once in it: a
    ``bbox_inches="tight"`` would draw every cell twice, once to measure."""
    buffer = io.StringIO()
    fig.set_dpi(SVG_DPI)  # measured as drawn: an SVG's text is laid out at 72 dpi
    box = fig.get_tightbbox().padded(PAD_INCHES)
    fig.savefig(buffer, format="svg", bbox_inches=box,
                metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = buffer.getvalue()
    # inline: no XML prolog or DOCTYPE (a DTD reference a browser would not need)
    return svg[svg.index("<svg"):]


def _cell_lines(entry: CacheEntry, stale: Collection[StaleKey]) -> list[str]:
    words = marks(entry, stale).words()
    return [cut(escape(entry.winner), NAME_WIDTH), latency(entry.ranking[0].stats.median_ns),
            *([", ".join(words)] if words else [])]


def cell_title(entry: CacheEntry, stale: Collection[StaleKey] = ()) -> str:
    """What hovering a cell shows: the key, the winner, the speedup, the confidence,
    the marks and the ranking."""
    words = marks(entry, stale).words()
    over = speedup(entry).runner_up
    return (f"{entry.bucket} {entry.dtype}: {entry.winner} (speedup over the runner-up: "
            f"{'timed alone' if over is None else ratio(over)}; confidence "
            f"{entry.confidence:.3f}" + "".join(f"; {word}" for word in words) + ")\n"
            + ranking_text(entry))


@dataclass(frozen=True)
class HeatMap:
    """What the heat map of one device and op draws: its first shape buckets
    (:data:`MAX_ROWS_PLOTTED`, in order), every dtype of the device and op, sorted, the
    entry of each cell drawn, and the longest line of any cell's text and whether any
    cell has three lines (its marks), over every cell, drawn or not, so the columns and
    rows are as wide and tall as they were for the whole group."""

    buckets: Sequence[str]
    dtypes: Sequence[str]
    cells: Mapping[tuple[str, str], CacheEntry]
    widest: int
    three_lines: bool


def cell_size(entry: CacheEntry, stale: Collection[StaleKey] = ()) -> tuple[int, bool]:
    """The longest line of the entry's cell text, in characters, and whether the text
    has three lines."""
    lines = _cell_lines(entry, stale)
    return max(map(len, lines)), len(lines) > 2


def heatmap_svg(heat: HeatMap, prefix: str, anchors: Mapping[CacheKey, str],
                stale: Collection[StaleKey] = ()) -> str:
    """The heat map as inline SVG. Each cell links to ``#ANCHOR`` (``anchors``: an
    entry's row in the page); the figure's own ids get ``prefix``, unique on the page."""
    mpl = matplotlib()
    with mpl.rc_context(RC):
        fig, titles = heatmap_figure(heat, anchors, stale)
        svg = svg_of(fig)
        mpl.pyplot.close(fig)
    for gid, title in titles.items():
        shown = "\n".join(map(text, title.split("\n")))  # one line a ranking row
        svg = svg.replace(f'<g id="{gid}">', f'<g id="{gid}"><title>{shown}</title>', 1)
    return prefixed_ids(svg, prefix)


RC = {"svg.fonttype": "none", "text.parse_math": False, "svg.hashsalt": "pytest-arbiter",
      "font.size": FONT_PT}
"""matplotlib's settings for a heat map: SVG text a browser draws (and finds), no math."""


def heatmap_figure(heat: HeatMap, anchors: Mapping[CacheKey, str],
                   stale: Collection[StaleKey] = ()) -> tuple[Any, dict[str, str]]:
    """The heat map's matplotlib figure (draw it under :data:`RC`) and the hover text of
    each cell by its ``gid``. A column is as wide as the widest cell or the longest
    unbroken part of its dtype; the dtypes (a user op's ``float32,int64,py_float``) and
    shape buckets are wrapped onto lines (:func:`wrap_label`), and a row is as tall as its
    cells or its bucket's lines: no label reaches another, at any number of inputs."""
    mpl = matplotlib()
    buckets, dtypes = heat.buckets, heat.dtypes
    annotate = len(buckets) * len(dtypes) <= MAX_ANNOTATED_CELLS
    chars = max(heat.widest,
                min(max((len(p) for d in dtypes for p in _breaks(escape(d))), default=0),
                    NAME_WIDTH))
    columns = [wrap_label(escape(d), chars, MAX_DTYPE_LINES) for d in dtypes]
    rows = [wrap_label(escape(b), ROW_LABEL_CHARS) for b in buckets]
    row_lines = max(3 if heat.three_lines else 2, *(r.count("\n") + 1 for r in rows))
    titles: dict[str, str] = {}
    fig = mpl.pyplot.figure(figsize=(max(chars * CHAR_PT + 12, 60) * len(dtypes) / 72,
                                     (row_lines * 12.5 + 8) * len(buckets) / 72))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    for row, bucket in enumerate(buckets):
        for col, dtype in enumerate(dtypes):
            entry = heat.cells.get((bucket, dtype))
            if entry is None:
                continue
            gid = f"cell-{len(titles)}"
            titles[gid] = cell_title(entry, stale)
            _draw_cell(ax, entry, (col, row), gid, anchors.get(entry.key),
                       _cell_lines(entry, stale) if annotate else [], stale)
    _axes(ax, rows, columns)
    for number, (label, bucket) in enumerate(zip(ax.get_yticklabels(), buckets, strict=True)):
        if label.get_text().endswith("..."):  # cut: the whole bucket on hover
            label.set_gid(f"bucket-{number}")
            titles[f"bucket-{number}"] = bucket
    return fig, titles


ROW_LABEL_CHARS = 22
"""Characters a line of a shape bucket's label holds: on a phone the first column of
cells still shows beside the labels."""
MAX_LABEL_LINES = 4
"""Lines of a shape bucket's label; a longer one ends in ``...`` (the table below the
heat map has it whole, and a cell's hover text)."""
MAX_DTYPE_LINES = 12
"""Lines of a dtype's label: a user op's, one input a line at worst, is shown whole."""
_BREAK_AFTER = re.compile(r"[^,/ -]+[,/ -]?|[,/ -]")
_BREAK_INSIDE = re.compile(r"[^x.]+[x.]?|[x.]")


def _breaks(label: str) -> list[str]:
    """``label`` cut after each ``,`` ``/`` ``-`` and space: where a line may end."""
    return _BREAK_AFTER.findall(label)


def wrap_label(label: str, width: int, max_lines: int = MAX_LABEL_LINES) -> str:
    """``label`` on lines of at most ``width`` characters: broken after a ``,`` ``/``
    ``-`` or space (``float32,int64,`` / ``py_float``), inside a longer part after an
    ``x`` or ``.`` (a shape's dimensions), anywhere in a longer run still. Past
    ``max_lines`` the last line ends in ``...``."""
    pieces = []
    for part in _breaks(label):
        small = [part] if len(part) <= width else _BREAK_INSIDE.findall(part)
        pieces += [p[i:i + width] for p in small for i in range(0, len(p), width)]
    lines = [""]
    for piece in pieces:
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        lines[-1] += piece
    if len(lines) > max_lines:
        lines[max_lines - 1:] = [cut("".join(lines[max_lines - 1:]), width)]
    return "\n".join(lines)


def _draw_cell(ax: Any, entry: CacheEntry, at: tuple[int, int], gid: str,
               anchor: str | None, lines: Sequence[str],
               stale: Collection[StaleKey]) -> None:
    """One cell: its colour, a dashed frame when flagged (not colour alone), its text."""
    from matplotlib.patches import Rectangle

    col, row = at
    step = band(speedup(entry).runner_up)
    flagged = marks(entry, stale).flagged
    patch = Rectangle((col + 0.03, row + 0.04), 0.94, 0.92, facecolor=step.colour,
                      edgecolor="#111111" if flagged else "white",
                      linewidth=2.0 if flagged else 1.0,
                      linestyle=(0, (4, 2)) if flagged else "solid")
    patch.set_gid(gid)
    if anchor is not None:
        patch.set_url(f"#{anchor}")
    ax.add_artist(patch)  # the limits are set: no data limits to update (add_patch)
    for number, line in enumerate(lines):
        # inside its cell, inside the axes: not measured for the figure's box (svg_of)
        ax.text(col + 0.5, row + (number + 0.75) / (len(lines) + 0.5), line,
                ha="center", va="center", color=step.ink,
                fontweight="bold" if number == 0 else "normal",
                fontstyle="italic" if number == 2 else "normal", in_layout=False)


def _axes(ax: Any, rows: Sequence[str], columns: Sequence[str]) -> None:
    """The axes around the cells; ``rows`` and ``columns``: the labels, escaped and
    wrapped."""
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(rows), 0)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xticks([i + 0.5 for i in range(len(columns))], columns)
    ax.set_yticks([i + 0.5 for i in range(len(rows))], rows)
    ax.set_xlabel("dtype")
    ax.set_ylabel("shape bucket")
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)


def prefixed_ids(svg: str, prefix: str) -> str:
    """Every id of one figure (matplotlib numbers them from 1 in each) and every
    reference to one, prefixed: several figures on one page keep their ids apart."""
    ids = set(re.findall(r'\bid="([^"]+)"', svg))
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    return re.sub(r'(url\(#|href="#)([^)"]+)',
                  lambda m: m.group(1) + (f"{prefix}-{m.group(2)}" if m.group(2) in ids
                                          else m.group(2)), svg)
