"""The cells of ``pytest-arbiter show``'s table: a row per entry, built a column at a
time for a block of entries (a million-entry corpus is a million rows: a Python call per
cell would be most of the command's time), and the latencies as people read them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from operator import attrgetter, itemgetter
from typing import NamedTuple

from pytest_arbiter.store.cache import CacheEntry
from pytest_arbiter.store.entry import RankedCandidate
from pytest_arbiter.store.safetext import escape


def format_ns(ns: float) -> str:
    """A latency to three significant digits, in the unit that reads best (``4.00 ms``
    beside ``13.5 us``, never ``4 ms``)."""
    for unit, scale in _UNITS:
        if ns >= scale * 0.9995:  # 999.6 ns rounds to 1.00 us, not 1000 ns
            return f"{_three_digits(ns / scale)} {unit}"
    return f"{_three_digits(ns)} ns"


_UNITS = (("s", 1e9), ("ms", 1e6), ("us", 1e3))


def _three_digits(value: float) -> str:
    if round(value, 1) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if round(value, 2) >= 10 else f"{value:.2f}"


def ns_cells(values: Sequence[float]) -> list[str]:
    """:func:`format_ns` of each of ``values``, worked out together: the unit and the
    digits of each in NumPy, then each format's text in one C loop; a value near where
    the unit or the digits change (or past what a float holds exactly) by
    ``format_ns`` itself."""
    import numpy as np

    if not values:
        return []
    ns = np.array(values, dtype=np.float64)
    unit = np.searchsorted(_BELOW, ns, side="right")  # 0: ns, 1: us, 2: ms, 3: s
    value = ns / np.array(_SCALES)[unit]
    # 0: "%.0f", 1: "%.1f", 2: "%.2f" (round(value, 1) >= 100, round(value, 2) >= 10)
    digits = np.where(value >= 99.951, 0, np.where(value < 9.9949, 2, 1))
    kind = unit * 3 + digits
    kind[((value >= 99.949) & (value < 99.951)) | ((value >= 9.9949) & (value < 10.0))
         | (ns >= 2.0**53)] = -1
    out = np.empty(len(values), dtype=object)
    for found in np.unique(kind).tolist():
        where = np.flatnonzero(kind == found)
        if found < 0:
            out[where] = [format_ns(values[at]) for at in where.tolist()]
        else:
            out[where] = list(map(_NS_FORMATS[found], value[where].tolist()))
    cells: list[str] = out.tolist()
    return cells


_BELOW = tuple(scale * 0.9995 for _, scale in reversed(_UNITS))
"""Where each unit starts (us, ms, s), as :func:`format_ns` compares."""
_SCALES = (1.0, *(scale for _, scale in reversed(_UNITS)))
_NS_FORMATS = tuple(f"{{:.{digits}f}} {unit}".format for unit in ("ns", "us", "ms", "s")
                    for digits in (0, 1, 2))


def slower(ratio: float, tie: bool) -> str:
    """How much slower the runner-up measured, with one sign. A runner-up faster by the
    median ranks second only in a tie (broken by tier): the difference is noise; or
    because it lost most of the paired rounds: marked ``*`` (:data:`PAIRED_NOTE`)."""
    pct = (ratio - 1) * 100
    if pct < 0 and tie:
        return f"\u00b1{-pct:.1f}%"
    return f"{pct:+.1f}%" + ("*" if pct < 0 else "")


PAIRED_NOTE = ("* a lower median, but ranked second: it lost most of the rounds timed side "
               "by side (docs/ci.md)")
SHOW_WIDTH = 100
NARROW_COLUMNS = ("key", "winner", "median", "runner-up", "confidence")
NARROW_CAPS = (44, 13, 8, 17, 10)
"""Each narrow column's widest cell: with the separators, 100 columns."""
MIN_KEY_PART = 6
"""The fewest characters a cut op keeps in ``show``'s key column."""
CUT_DEVICE = 10
"""The characters a long device tag keeps in ``show``'s key column (``cpu-x86...``)."""


def _cut(text: str, width: int, middle: bool = False) -> str:
    """``text`` in ``width`` columns: cut at the end, or in the middle (a key keeps
    its dtype)."""
    if len(text) <= width:
        return text
    if middle:
        head = (width - 3) // 2
        return text[:head] + "..." + text[len(text) - (width - 3 - head):]
    return text[:width - 3] + "..."


def narrow_row(e: CacheEntry, low: bool) -> tuple[str, ...]:
    """``show``'s default row: the key (device/op/bucket/dtype), the winner and its
    median, the runner-up and how much slower, the confidence (``low``: the entry's
    :attr:`~CacheEntry.low_confidence`); cut to fit 100 columns."""
    ranking = e.ranking
    second = ranking[1] if len(ranking) > 1 else None
    names: tuple[str, ...] = (e.device, e.op, e.bucket, e.dtype, ranking[0].name,
                              "" if second is None else second.name)
    if not "".join(names).isprintable():  # one C call: most rows have nothing to escape
        names = tuple(map(escape, names))
    if second is None:
        runner = "-"
    else:
        if second.carried:
            how = "carried"
        else:
            ratio = e.over_winner(second)
            how = "-" if ratio is None else slower(ratio, e.tie)
        runner = f"{_cut(names[5], NARROW_CAPS[3] - len(how) - 1)} {how}"
    conf = f"{e.confidence:.3f}"
    if e.tie:
        conf += " tie,low" if low else " tie"
    elif low:
        conf += " low"
    winner = names[4]
    median = format_ns(ranking[0].stats.median_ns)
    caps = NARROW_CAPS
    return (key_cell(*names[:4]),
            winner if len(winner) <= caps[1] else _cut(winner, caps[1]),
            median if len(median) <= caps[2] else _cut(median, caps[2]),
            runner if len(runner) <= caps[3] else _cut(runner, caps[3]),
            conf if len(conf) <= caps[4] else _cut(conf, caps[4]))


def key_cell(device: str, op: str, bucket: str, dtype: str) -> str:
    """``device/op/bucket/dtype`` in the key column. Too long, the device tag is cut
    first, to one width (a long CPU tag is the same on every row of a runner, and the
    summary line names it whole), then the op: the bucket and dtype, what tells one row
    from the next, stay whole while they fit; the rest is cut in the middle."""
    key = f"{device}/{op}/{bucket}/{dtype}"
    width = NARROW_CAPS[0]
    if len(key) <= width:
        return key
    tag = _cut(device, CUT_DEVICE)
    tail = f"{bucket}/{dtype}"
    room = width - len(tag) - len(tail) - 2  # the op's, between two slashes
    if room >= len(op):
        return f"{tag}/{op}/{tail}"
    return _cut(f"{tag}/{_cut(op, max(room, MIN_KEY_PART))}/{tail}", width, middle=True)


class Columns(NamedTuple):
    """A block's rows as columns of cells (escaped), and whether a runner-up was
    printed faster than its winner with no tie (:data:`PAIRED_NOTE`)."""

    cells: list[list[str]]
    paired: bool


def row_columns(rows: Iterable[Sequence[str]], width: int) -> list[list[str]]:
    """Rows of ``width`` cells as columns."""
    columns = [list(column) for column in zip(*rows, strict=True)]
    return columns or [[] for _ in range(width)]


_RANKING = attrgetter("ranking")
_FIRST = itemgetter(0)
_NAME = attrgetter("name")
_MEDIAN = attrgetter("stats.median_ns")
_KEY_PARTS = tuple(map(attrgetter, ("device", "op", "bucket", "dtype")))
_CONFIDENCE = attrgetter("confidence")
_TIE = attrgetter("tie")
_CONF_TAIL = {(False, False): "", (True, False): " tie", (True, True): " tie,low",
              (False, True): " low"}


class _ConfCells(dict[tuple[float, bool, bool], str]):
    """The confidence cell of a confidence, tie and low confidence, made the first time
    (a corpus holds a few thousand confidences); a zero is never kept (``-0.0`` is
    written ``-0.000``, and equals ``0.0``)."""

    def __missing__(self, key: tuple[float, bool, bool]) -> str:
        confidence, tie, low = key
        cell = f"{confidence:.3f}" + _CONF_TAIL[tie, low]
        if confidence:
            if len(self) >= CONF_CELLS_KEPT:
                self.clear()
            self[key] = cell
        return cell


CONF_CELLS_KEPT = 1 << 16
"""The most confidence cells :data:`_CONF_CELLS` keeps (then it starts again)."""
_CONF_CELLS = _ConfCells()


def narrow_columns(block: Sequence[CacheEntry], lows: Sequence[bool]) -> Columns:
    """:func:`narrow_row` of each entry of ``block`` (``lows``: their
    :attr:`~CacheEntry.low_confidence`), a column at a time: the same cells."""
    rankings = list(map(_RANKING, block))
    firsts = list(map(_FIRST, rankings))
    device, op, bucket, dtype = ([*map(part, block)] for part in _KEY_PARTS)
    winners = list(map(_NAME, firsts))
    seconds = [ranking[1].name for ranking in rankings if len(ranking) > 1]
    if not "".join(itertools.chain(device, op, bucket, dtype, winners, seconds)
                   ).isprintable():  # a name to escape: the rows one by one
        rows = list(map(narrow_row, block, lows))
        return Columns(row_columns(rows, len(NARROW_CAPS)),
                       any(map(paired_only, block)))
    caps = NARROW_CAPS
    keys = list(map("{}/{}/{}/{}".format, device, op, bucket, dtype))
    for at in _longer(keys, caps[0]):
        keys[at] = key_cell(device[at], op[at], bucket[at], dtype[at])
    runners, paired = _runner_cells(block, rankings)
    confs = list(map(_CONF_CELLS.__getitem__,
                     zip(map(_CONFIDENCE, block), map(_TIE, block), lows, strict=True)))
    medians = ns_cells(list(map(_MEDIAN, firsts)))
    cells = [keys, *(_fit(column, cap) for column, cap in
                     zip((winners, medians, runners, confs), caps[1:], strict=True))]
    return Columns(cells, paired)


def _longer(cells: list[str], width: int) -> list[int]:
    """Where ``cells`` has a cell wider than ``width`` (one C pass when none is)."""
    if not cells or max(map(len, cells)) <= width:
        return []
    return [at for at, size in enumerate(map(len, cells)) if size > width]


def _fit(cells: list[str], width: int) -> list[str]:
    """``cells`` each cut to ``width``; a column of a few names (the winners) cut once
    each."""
    if not cells or max(map(len, cells)) <= width:
        return cells
    distinct = set(cells)
    if len(distinct) > len(cells) // 8:  # many distinct cells: each as it comes
        return [c if len(c) <= width else _cut(c, width) for c in cells]
    cut = {cell: _cut(cell, width) for cell in distinct}
    return list(map(cut.__getitem__, cells))


def _runner_cells(block: Sequence[CacheEntry], rankings: list[tuple[RankedCandidate, ...]]
                  ) -> tuple[list[str], bool]:
    """:func:`narrow_row`'s runner-up cells (cut to the name's room, not yet to the
    column's), and whether one was marked ``*``."""
    room = NARROW_CAPS[3] - 1
    out: list[str] = []
    star = False
    cuts: dict[tuple[str, int], str] = {}
    for entry, ranking in zip(block, rankings, strict=True):
        if len(ranking) < 2:
            out.append("-")
            continue
        second = ranking[1]
        if second.carried:
            how = "carried"
        else:
            ratio = second.ratio
            if ratio is None:
                best = ranking[0].stats.median_ns
                ratio = second.stats.median_ns / best if best > 0 else None
            if ratio is None:
                how = "-"
            else:
                pct = (ratio - 1) * 100
                if pct >= 0:
                    how = f"{pct:+.1f}%"
                elif entry.tie:
                    how = f"\u00b1{-pct:.1f}%"
                else:
                    how, star = f"{pct:+.1f}%*", True
        name = second.name
        if len(name) > room - len(how):
            width = room - len(how)
            cut = cuts.get((name, width))
            if cut is None:
                cut = cuts[name, width] = _cut(name, width)
            name = cut
        out.append(f"{name} {how}")
    return out, star


def paired_only(e: CacheEntry) -> bool:
    """``show`` printed a runner-up faster than the winner that no tie ranked second (a
    row without a paired ratio, whose own median is lower)."""
    if len(e.ranking) < 2 or e.tie:
        return False
    ratio = e.over_winner(e.ranking[1])
    return ratio is not None and ratio < 1.0
