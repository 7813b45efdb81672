"""The cells of ``pytest-arbiter show``'s table: a row per entry, built a column at a
time for a block of entries (a million-entry corpus is a million rows: a Python call per
cell would be most of the command's time), and the latencies as people read them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from operator import attrgetter, itemgetter
from typing import Generic, NamedTuple, TypeVar

from pytest_arbiter.store.cache import CacheEntry
from pytest_arbiter.store.entry import RankedCandidate
from pytest_arbiter.store.safetext import escape, printable


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
    """:func:`format_ns` of each of ``values``, worked out together: the unit, the
    digits and the rounded digits of each in NumPy, each distinct text made once (a
    column holds a few thousand); a value near where the unit or the digits change, near
    half a last digit, negative or past what a float holds exactly, by ``format_ns``
    itself."""
    import numpy as np

    if not values:
        return []
    ns = np.array(values, dtype=np.float64)
    unit = np.searchsorted(_BELOW, ns, side="right")  # 0: ns, 1: us, 2: ms, 3: s
    value = ns / np.array(_SCALES)[unit]
    # 0: "%.0f", 1: "%.1f", 2: "%.2f" (round(value, 1) >= 100, round(value, 2) >= 10)
    digits = np.where(value >= 99.951, 0, np.where(value < 9.9949, 2, 1))
    # the value in units of its last digit: its text is the nearest whole number's,
    # unless it lies too near half way for a float's product to tell
    scaled = value * np.array((1.0, 10.0, 100.0))[digits]
    unsure = (((value >= 99.949) & (value < 99.951)) | ((value >= 9.9949) & (value < 10.0))
              | (ns >= 2.0**53) | np.signbit(ns)
              | (np.abs(scaled - np.floor(scaled) - 0.5) < 1e-6))
    whole = np.rint(np.where(unsure, 0.0, scaled)).astype(np.int64)
    cells: list[str] = list(map(_NS_CELLS.__getitem__,
                                (whole * 12 + unit * 3 + digits).tolist()))
    for at in np.flatnonzero(unsure).tolist():
        cells[at] = format_ns(values[at])
    return cells


_BELOW = tuple(scale * 0.9995 for _, scale in reversed(_UNITS))
"""Where each unit starts (us, ms, s), as :func:`format_ns` compares."""
_SCALES = (1.0, *(scale for _, scale in reversed(_UNITS)))
_UNIT_NAMES = ("ns", "us", "ms", "s")


_K = TypeVar("_K")


class _Texts(dict[_K, str], Generic[_K]):
    """Cell texts made the first time they are asked for (:meth:`make`), at most
    :data:`CELLS_KEPT` of them kept (then it starts again)."""

    def __missing__(self, key: _K) -> str:
        text = self.make(key)
        if self.keeps(key):
            if len(self) >= CELLS_KEPT:
                self.clear()
            self[key] = text
        return text

    def make(self, key: _K) -> str:
        raise NotImplementedError

    def keeps(self, key: _K) -> bool:
        return True


CELLS_KEPT = 1 << 16
"""The most texts a :class:`_Texts` keeps: latencies below a second are under 10,000,
but whole seconds go on; a corpus holds a few thousand confidences."""


class _NsCells(_Texts[int]):
    """The text of a latency coded as its rounded digits ``whole``, its unit and its
    digits after the point (``whole * 12 + unit * 3 + digits``)."""

    def make(self, code: int) -> str:
        whole, rest = divmod(code, 12)
        unit, digits = divmod(rest, 3)
        if digits:
            head, tail = divmod(whole, 10**digits)
            return f"{head}.{tail:0{digits}d} {_UNIT_NAMES[unit]}"
        return f"{whole} {_UNIT_NAMES[unit]}"


_NS_CELLS = _NsCells()


def slower(ratio: float, tie: bool) -> str:
    """How much slower the runner-up measured, with one sign. A runner-up faster ranks
    second only in a tie (broken by tier): the difference is noise; or as a crawler
    dropped from the comparison, or by its median in a file without paired ratios:
    marked ``*`` (:data:`PAIRED_NOTE`)."""
    pct = (ratio - 1) * 100
    if pct < 0 and tie:
        return f"\u00b1{-pct:.1f}%"
    return f"{pct:+.1f}%" + ("*" if pct < 0 else "")


PAIRED_NOTE = ("* faster where timed, yet ranked second: a crawler dropped from the "
               "rounds, or no paired ratio")
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
_STATS = attrgetter("stats")
_MEDIAN_NS = attrgetter("median_ns")
_KEY_PARTS = tuple(map(attrgetter, ("device", "op", "bucket", "dtype")))
_CONFIDENCE = attrgetter("confidence")
_TIE = attrgetter("tie")
_CONF_TAIL = {(False, False): "", (True, False): " tie", (True, True): " tie,low",
              (False, True): " low"}


def _conf_cells(confidences: list[float], ties: list[bool], lows: Sequence[bool]
                ) -> list[str]:
    """:func:`narrow_row`'s confidence cells: each confidence's thousandths rounded in
    NumPy, each distinct cell made once; one too near half a thousandth for a float's
    product to tell, or negative (``-0.0`` is written ``-0.000``), by its own format."""
    import numpy as np

    if not confidences:
        return []
    conf = np.array(confidences, dtype=np.float64)
    thousandths = conf * 1000
    with np.errstate(all="ignore"):
        unsure = (~((conf >= 0) & (conf <= 1)) | np.signbit(conf)
                  | (np.abs(thousandths - np.floor(thousandths) - 0.5) < 1e-6))
    whole = np.rint(np.where(unsure, 0.0, thousandths)).astype(np.int64)
    code = whole * 4 + np.array(ties, dtype=np.int64) * 2 + np.array(lows, dtype=np.int64)
    cells: list[str] = list(map(_CONF_CELLS.__getitem__, code.tolist()))
    for at in np.flatnonzero(unsure).tolist():
        cells[at] = _EXACT_CONF[confidences[at]] + _CONF_TAIL[ties[at], bool(lows[at])]
    return cells


class _ExactConf(_Texts[float]):
    """A confidence's own text; a zero is never kept (``-0.0`` is written ``-0.000``,
    and equals ``0.0``)."""

    def make(self, confidence: float) -> str:
        return f"{confidence:.3f}"

    def keeps(self, confidence: float) -> bool:
        return bool(confidence)


_EXACT_CONF = _ExactConf()


class _ConfCells(dict[int, str]):
    """The confidence cell of a confidence coded as its thousandths rounded, its tie and
    its low confidence (``whole * 4 + tie * 2 + low``), made the first time."""

    def __missing__(self, code: int) -> str:
        whole, rest = divmod(code, 4)
        head, tail = divmod(whole, 1000)
        cell = self[code] = f"{head}.{tail:03d}" + _CONF_TAIL[rest >= 2, rest % 2 == 1]
        return cell


_CONF_CELLS = _ConfCells()
"""Every confidence cell made so far (at most 1,001 thousandths times four tails)."""


def narrow_columns(block: Sequence[CacheEntry], lows: Sequence[bool]) -> Columns:
    """:func:`narrow_row` of each entry of ``block`` (``lows``: their
    :attr:`~CacheEntry.low_confidence`), a column at a time: the same cells."""
    rankings = list(map(_RANKING, block))
    firsts = list(map(_FIRST, rankings))
    parts = [list(map(part, block)) for part in _KEY_PARTS]
    keys = list(map("/".join, zip(*parts, strict=True)))
    winners = list(map(_NAME, firsts))
    two = list(map(_TWO_OR_MORE, map(len, rankings)))
    pairs = list(itertools.compress(rankings, two))
    seconds = list(map(_SECOND, pairs))
    names = list(map(_NAME, seconds))
    if not printable("".join(itertools.chain(keys, winners, names))):
        # a name to escape ("/" needs none): the rows one by one
        rows = list(map(narrow_row, block, lows))
        return Columns(row_columns(rows, len(NARROW_CAPS)),
                       any(map(paired_only, block)))
    caps = NARROW_CAPS
    _fit_keys(keys, *parts)
    ties = list(map(_TIE, block))
    runners, paired = _runner_cells(ties, two, pairs, seconds, names)
    confs = _conf_cells(list(map(_CONFIDENCE, block)), ties, lows)
    medians = ns_cells(list(map(_MEDIAN_NS, map(_STATS, firsts))))
    cells = [keys, *(_fit(column, cap) for column, cap in
                     zip((winners, medians, runners, confs), caps[1:], strict=True))]
    return Columns(cells, paired)


def _fit_keys(keys: list[str], device: list[str], op: list[str], bucket: list[str],
              dtype: list[str]) -> None:
    """:func:`key_cell` of each key too wide for its column, in place: the device's tag
    cut once per device; where that is not enough, the row's own cut."""
    width = NARROW_CAPS[0]
    wide = _longer(keys, width)
    if not wide:
        return
    tags = {tag: _cut(tag, CUT_DEVICE) for tag in set(map(device.__getitem__, wide))}
    for at in wide:
        key = f"{tags[device[at]]}/{op[at]}/{bucket[at]}/{dtype[at]}"
        keys[at] = key if len(key) <= width else key_cell(device[at], op[at], bucket[at],
                                                           dtype[at])


def _longer(cells: list[str], width: int) -> list[int]:
    """Where ``cells`` has a cell wider than ``width`` (one C pass when none is)."""
    if not cells or max(map(len, cells)) <= width:
        return []
    return list(itertools.compress(range(len(cells)), map(width.__lt__, map(len, cells))))


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


def _runner_cells(ties: list[bool], two: list[bool], pairs: list[tuple[RankedCandidate, ...]],
                  seconds: list[RankedCandidate], names: list[str]) -> tuple[list[str], bool]:
    """:func:`narrow_row`'s runner-up cells (cut to the name's room, not yet to the
    column's), and whether one was marked ``*``, of the rankings with a runner-up
    (``two``: which of the block's have one; ``pairs``: those rankings, ``seconds`` and
    ``names`` their runners-up): how much slower each runner-up was worked out in
    NumPy and each distinct text made once; a carried row, one without a ratio whose
    winner's median is zero, and a percentage too large or too near half its last digit
    for a float's product to tell, by :func:`_how`."""
    import numpy as np

    if not pairs:
        return ["-"] * len(two), False
    tie = np.array(list(itertools.compress(ties, two)), dtype=bool)
    best = np.array(list(map(_MEDIAN_NS, map(_STATS, map(_FIRST, pairs)))), dtype=np.float64)
    median = np.array(list(map(_MEDIAN_NS, map(_STATS, seconds))), dtype=np.float64)
    ratio = np.array(list(map(_RATIO, seconds)), dtype=np.float64)  # None: NaN
    own = np.isnan(ratio)  # no paired ratio: the medians' ratio, as over_winner's
    with np.errstate(all="ignore"):  # an overflow or a NaN is unsure, worked out alone
        np.divide(median, best, out=ratio, where=own & (best > 0))
        pct = (ratio - 1) * 100
        tenths = np.abs(pct) * 10
        unsure = (np.array(list(map(_CARRIED, seconds)), dtype=bool)
                  | (own & ((best <= 0) | (best >= 2.0**53) | (median >= 2.0**53)))
                  | ~(tenths < 1e10) | (np.abs(tenths - np.floor(tenths) - 0.5) < 1e-6))
    # 0: "+1.5%", 1: a tie's "\u00b11.5%", 2: a faster runner-up's "-1.5%*"
    kind = np.where(pct < 0, np.where(tie, 1, 2), 0)
    whole = np.rint(np.where(unsure, 0.0, tenths)).astype(np.int64)
    hows: list[str] = list(map(_HOW_CELLS.__getitem__, (whole * 3 + kind).tolist()))
    star = bool(((kind == 2) & ~unsure).any())
    for at in np.flatnonzero(unsure).tolist():
        hows[at], marked = _how(pairs[at], bool(tie[at]))
        star = star or marked
    # each name cut to leave room for its percentage: a cut made once per name and room
    roomy = _RoomyNames(NARROW_CAPS[3] - 1)
    room = map(roomy.__getitem__, zip(names, map(len, hows), strict=True))
    cells = list(map(" ".join, zip(room, hows, strict=True)))
    if len(pairs) == len(two):
        return cells, star
    out = np.full(len(two), "-", dtype=object)
    out[np.array(two, dtype=bool)] = cells
    every: list[str] = out.tolist()
    return every, star


def _how(ranking: tuple[RankedCandidate, ...], tie: bool) -> tuple[str, bool]:
    """How much slower the runner-up of ``ranking`` was, as :func:`narrow_row` says it,
    and whether it is marked ``*``."""
    second = ranking[1]
    if second.carried:
        return "carried", False
    ratio = second.ratio
    if ratio is None:
        best = ranking[0].stats.median_ns
        ratio = second.stats.median_ns / best if best > 0 else None
    if ratio is None:
        return "-", False
    pct = (ratio - 1) * 100
    if pct >= 0:
        return f"{pct:+.1f}%", False
    if tie:
        return f"\u00b1{-pct:.1f}%", False
    return f"{pct:+.1f}%*", True


class _RoomyNames(dict[tuple[str, int], str]):
    """A runner-up's name beside a percentage of a given length, cut to leave it room
    in ``room`` columns: each name and length worked out once."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def __missing__(self, key: tuple[str, int]) -> str:
        name, how = key
        width = self.room - how
        cell = self[key] = name if len(name) <= width else _cut(name, width)
        return cell


class _HowCells(_Texts[int]):
    """The text of a runner-up's percentage coded as its tenths rounded and its kind
    (``whole * 3 + kind``: 0 slower, 1 faster in a tie, 2 faster)."""

    def make(self, code: int) -> str:
        whole, kind = divmod(code, 3)
        head, tenth = divmod(whole, 10)
        return (f"+{head}.{tenth}%", f"\u00b1{head}.{tenth}%", f"-{head}.{tenth}%*")[kind]


_HOW_CELLS = _HowCells()
_TWO_OR_MORE = (1).__lt__
_SECOND = itemgetter(1)
_RATIO = attrgetter("ratio")
_CARRIED = attrgetter("carried")


def paired_only(e: CacheEntry) -> bool:
    """``show`` printed a runner-up faster than the winner that no tie ranked second (a
    row without a paired ratio, whose own median is lower)."""
    if len(e.ranking) < 2 or e.tie:
        return False
    ratio = e.over_winner(e.ranking[1])
    return ratio is not None and ratio < 1.0
