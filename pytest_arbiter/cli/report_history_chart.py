"""The chart of ``pytest-arbiter report --history``: each key's median over the corpus's
versions, one line a key, a diamond where its winner changed; drawn by matplotlib as
inline SVG at a fixed size (a phone scrolls it in its box, its labels keep 12 px)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_arbiter.cli.report_cells import cut
from pytest_arbiter.cli.report_heatmap import (
    FONT_PT,
    matplotlib,
    prefixed_ids,
    svg_of,
    wrap_label,
)
from pytest_arbiter.store.safetext import escape

MAX_LINES = 12
"""Keys drawn per chart: those whose median moved most; the table lists them all."""

LEGEND_WIDTH = 28
"""Characters per line of a legend entry: a longer key wraps on as many lines as it
takes (its dtype kept), never cut to look like another key's."""

Series = Sequence[tuple[float, bool] | None]
"""Per version: the median in nanoseconds and whether the winner changed there."""


def _moved(points: Series) -> float:
    values = [p[0] for p in points if p is not None]
    changed = sum(1 for p in points if p is not None and p[1])
    return changed + (max(values) / min(values) if values and min(values) > 0 else 0.0)


def chart_svg(lines: Mapping[str, Series], labels: Sequence[str], prefix: str) -> str:
    """The chart of ``lines`` (a key's label to its series) over the versions
    ``labels``, as inline SVG whose ids start with ``prefix``."""
    mpl = matplotlib()
    plt = mpl.pyplot
    shown = sorted(lines, key=lambda k: -_moved(lines[k]))[:MAX_LINES]
    with mpl.rc_context({"svg.fonttype": "none", "text.parse_math": False,
                         "svg.hashsalt": "pytest-arbiter", "font.size": FONT_PT}):
        fig, ax = plt.subplots(figsize=(max(4.2, 0.55 * len(labels) + 2.2), 3.0))
        for name in sorted(shown):
            xs = [i for i, p in enumerate(lines[name]) if p is not None]
            ys = [p[0] / 1e3 for p in lines[name] if p is not None]
            (line,) = ax.plot(xs, ys, marker="o", markersize=4,
                              label=wrap_label(escape(name), LEGEND_WIDTH,
                                               max_lines=len(name)))
            flips = [(i, p[0] / 1e3) for i, p in enumerate(lines[name])
                     if p is not None and p[1]]
            if flips:
                ax.plot(*zip(*flips, strict=True), linestyle="none", marker="D",
                        markersize=9, markerfacecolor="none", markeredgewidth=1.5,
                        color=line.get_color())
        ax.set_xticks(range(len(labels)), [cut(escape(v), 12) for v in labels],
                      rotation=45, ha="right")
        ax.set_ylabel("median (\u00b5s)")
        _log_axis(ax, [p[0] / 1e3 for name in shown for p in lines[name] if p is not None])
        ax.grid(True, which="both", alpha=0.3)
        if shown:
            ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                      title="bucket dtype (diamond: new winner)")
        svg = svg_of(fig)
        plt.close(fig)
    return prefixed_ids(svg, prefix)


_STEPS = ((1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
          (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0))
"""The plain numbers a log axis is labelled with, per decade: the first set that puts
three labels or more on the axis."""


def _log_axis(ax: object, values: list[float]) -> None:
    """A log scale labelled in plain numbers, not math text, from a label at or below
    the lowest value to one at or above the highest: no line lies past the last label."""
    import math

    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ax.set_yscale("log")  # type: ignore[attr-defined]
    axis = ax.yaxis  # type: ignore[attr-defined]
    axis.set_minor_formatter(NullFormatter())
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    shown = [v for v in values if v > 0 and math.isfinite(v)]
    if not shown:
        return
    lo, hi = min(shown), max(shown)
    for steps in _STEPS:
        ticks = [s * 10.0 ** k for k in range(math.floor(math.log10(lo)) - 1,
                                             math.ceil(math.log10(hi)) + 1) for s in steps]
        below = max(t for t in ticks if t <= lo * (1 + 1e-9))
        above = min(t for t in ticks if t >= hi * (1 - 1e-9))
        inside = [t for t in ticks if below <= t <= above]
        if len(inside) >= 3 or steps is _STEPS[-1]:
            break
    if above <= below:
        above = min(t for t in ticks if t > below)
    ax.set_ylim(below / 1.05, above * 1.05)  # type: ignore[attr-defined]
    axis.set_major_locator(FixedLocator([t for t in ticks if below <= t <= above]))
