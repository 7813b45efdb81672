"""What ``pytest-arbiter report`` shows of one entry: its median with units, its
speedups, the page's one colour scale, its marks (low confidence, stale, tie), its
ranking as text, and the escaping every artifact string goes through."""

from __future__ import annotations

import html
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_arbiter.store.cache import CacheEntry
from pytest_arbiter.store.safetext import counted, escape

StaleKey = tuple[str, str, str, str]
"""(target, op, bucket, dtype): a key a recheck found stale (a JUnit report's
``arbiter-stale:`` line names no device)."""


def text(value: object) -> str:
    """An artifact's string, safe inside HTML and SVG text and attributes."""
    return html.escape(escape(value), quote=True)


LONG_PART = 24
"""Characters of a key's part (between slashes and commas) past which it may also wrap
between its dimensions."""


def breakable(value: object) -> str:
    """:func:`text`, with a line allowed to end after each ``/`` and ``,`` (``<wbr>``),
    and inside a part longer than :data:`LONG_PART` between its dimensions (an ``x`` or
    ``.`` between digits: ``256x|256``, ``16.|16``): a key, a user op's bucket and dtype
    wrap in a narrow table instead of widening it, never inside a number or a name (a
    part with a hyphen, a device's name, is kept on one line; the page's style breaks
    a table's cells nowhere else)."""
    shown = escape(value)
    long = len(shown) > LONG_PART and any(len(p) > LONG_PART for p in _PARTS.split(shown))
    if not long and "-" not in shown:
        # the common case, fast (a table row a key): no entity holds a slash or a comma
        return html.escape(shown, quote=True).replace("/", "/<wbr>").replace(",", ",<wbr>")
    pieces: list[str] = []
    for part in re.findall(r"[^/,]*[/,]?", shown):
        pieces += _BETWEEN_DIMS.split(part) if len(part) > LONG_PART else [part]
    return "<wbr>".join(_unbroken(piece) for piece in pieces if piece)


def _unbroken(piece: str) -> str:
    """A piece of a key as HTML that wraps nowhere (a browser may break after a hyphen)."""
    shown = html.escape(piece, quote=True)
    return f'<span class="nowrap">{shown}</span>' if "-" in piece else shown


_PARTS = re.compile(r"[/,]")
_BETWEEN_DIMS = re.compile(r"(?<=\d[x.])(?=\d)")
_ID_BREAKS = re.compile(r"(?<=::)|(?<=[/\[-])(?!:)")


def breakable_id(value: object) -> str:
    """:func:`text` of a test id, with a line allowed to end only after ``::``, ``/``,
    ``[`` and ``-`` (``<wbr>``): ``test_x.py::|test_cumsum[|2000]``, never inside a
    name."""
    return "<wbr>".join(html.escape(piece, quote=True)
                        for piece in _ID_BREAKS.split(escape(value)) if piece)


def when(value: object) -> str:
    """A timestamp as HTML that may wrap only between its date and its time; ``-`` for
    none (an empty or unset field)."""
    if not value:
        return "-"
    day, t, clock = str(value).partition("T")
    return "<wbr>".join(f'<span class="nowrap">{text(piece)}</span>'
                        for piece in (day + t, clock) if piece)


def natural(value: str) -> list[Any]:
    """A sort key that puts ``8x8`` before ``16x16``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", value)]


def natural_keys(values: Sequence[str]) -> list[str]:
    """:func:`natural` of each value as one string, a few times cheaper: two values'
    strings compare as their :func:`natural` lists do. Each run of digits becomes
    ``\\x00``, a character for its length (:func:`_length`) and its digits without
    leading zeros (a shorter number sorts first, and a run sorts before any text, as the
    shorter text of the lists does); a ``\\x00`` or ``\\x01`` of the value is written
    ``\\x01`` and itself, so the marker sorts before every character."""
    joined = "\n".join(values)
    if _LOW.search(joined) or joined.count("\n") != max(len(values) - 1, 0):
        return [_keyed(_LOW.sub(_escaped, v)) for v in values]
    return _keyed(joined).split("\n") if values else []


def _keyed(text: str) -> str:
    """``text`` with each run of digits as :func:`natural_keys` writes it: split apart
    in one C pass, each distinct run written once (a corpus's buckets repeat few
    numbers), and joined again."""
    pieces = _DIGITS.split(text)
    runs = pieces[1::2]
    table = {run: _run(run) for run in set(runs)}
    pieces[1::2] = map(table.__getitem__, runs)
    return "".join(pieces)


_DIGITS = re.compile(r"(\d+)")
_LOW = re.compile("[\x00\x01]")


def _run(digits: str) -> str:
    digits = digits.lstrip("0") or "0" if digits.isascii() else str(int(digits))
    return f"\x00{_length(len(digits))}{digits}"


def _length(count: int) -> str:
    """The character that says how many digits a run has, past the control characters:
    no key holds a line break (what joins the values), whatever its numbers' lengths."""
    return chr(0x100 + count)


def _escaped(found: re.Match[str]) -> str:
    return "\x01" + found.group()


def latency(ns: float) -> str:
    """A median with its unit, three significant digits: ``1.50 µs``, ``812 ns``."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("\u00b5s", 1e3), ("ns", 1.0)):
        if ns >= scale or unit == "ns":
            value = ns / scale
            digits = 0 if value >= 100 else 1 if value >= 10 else 2
            return f"{value:.{digits}f} {unit}"
    raise AssertionError("unreachable")


def cut(value: str, width: int) -> str:
    """``value`` in at most ``width`` characters (``...`` at the end when cut)."""
    return value if len(value) <= width else value[:width - 3] + "..."


@dataclass(frozen=True)
class Speedup:
    """How much faster the winner measured than the runner-up and than the slowest
    (``None`` when no other row was timed with it)."""

    runner_up: float | None
    slowest: float | None


def speedup(entry: CacheEntry) -> Speedup:
    # only rows timed side by side with the winner say how much slower they are
    ratios = [r for r in map(entry.over_winner, entry.ranking[1:]) if r is not None]
    if not ratios:
        return Speedup(None, None)
    return Speedup(ratios[0], max(ratios))


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


@dataclass(frozen=True)
class Band:
    """One step of the page's colour scale: speedups from ``low`` (inclusive) up."""

    low: float
    label: str
    colour: str
    ink: str
    """The text colour that reads on ``colour``."""


SCALE = (
    Band(0.0, "below 1.00x (ranked by the paired rounds)", "#e7e1ef", "#000000"),
    Band(1.0, "1.00x to 1.05x", "#ffffe5", "#000000"),
    Band(1.05, "1.05x to 1.10x", "#f7fcb9", "#000000"),
    Band(1.10, "1.10x to 1.25x", "#d9f0a3", "#000000"),
    Band(1.25, "1.25x to 1.50x", "#addd8e", "#000000"),
    Band(1.50, "1.50x to 2x", "#78c679", "#000000"),
    Band(2.0, "2x to 4x", "#238443", "#ffffff"),
    Band(4.0, "4x and more", "#004529", "#ffffff"),
)
"""The one colour scale of a page (and of every page): the winner's speedup over the
runner-up. Fixed steps, so a colour means the same in every heat map."""
ALONE = Band(-1.0, "timed alone (no runner-up timed with the winner)", "#d9d9d9",
             "#000000")


def band(value: float | None) -> Band:
    """The step of :data:`SCALE` a speedup falls in (:data:`ALONE` for ``None``)."""
    if value is None:
        return ALONE
    found = SCALE[0]
    for step in SCALE:
        if value >= step.low:
            found = step
    return found


@dataclass(frozen=True)
class Marks:
    """What a reader must not miss about an entry, each also said in words."""

    low_confidence: bool
    stale: str | None
    """Why the entry is stale (``None``: it is not)."""
    tie: bool

    def words(self) -> list[str]:
        return ((["low confidence"] if self.low_confidence else [])
                + (["stale"] if self.stale else []) + (["tie"] if self.tie else []))

    @property
    def flagged(self) -> bool:
        return self.low_confidence or self.stale is not None


def marks(entry: CacheEntry, stale: Collection[StaleKey] = ()) -> Marks:
    """The entry's marks; ``stale``: the keys a recheck found stale."""
    why = None
    if entry.reverify:
        why = "the environment changed since it was measured (reverify)"
    elif (entry.target, entry.op, entry.bucket, entry.dtype) in stale:
        why = "a recheck found the winner slower than another candidate"
    return Marks(entry.low_confidence, why, entry.tie)


def due_for_remeasurement(entry: CacheEntry) -> str | None:
    """Why the entry should be measured again, or ``None``."""
    if entry.reverify:
        return "the environment changed since it was measured (reverify)"
    if not entry.considered:
        return "it does not record what it was measured against (no considered candidates)"
    if entry.low_confidence:
        rounds = entry.provenance.rounds
        return (f"low-confidence pick (confidence {entry.confidence:.3f}, "
                f"{counted(rounds, 'round') if rounds else '? rounds'}): re-tune with a larger "
                "--arbiter-tune-budget")
    return None


def key_text(entry: CacheEntry) -> str:
    return "/".join(entry.key)


def ranking_text(entry: CacheEntry) -> str:
    """The ranking, one row a line: place, name, median, how much slower than the winner
    as ranked (its paired ratio; a row without one: its median over the winner's)."""
    lines = []
    for place, row in enumerate(entry.ranking, 1):
        over = entry.over_winner(row)
        how = ("carried from an earlier comparison" if row.carried
               else "winner" if place == 1
               else "" if over is None
               else f"{over:.2f}x the winner's median" if row.ratio is None
               else f"{over:.2f}x the winner in the rounds timed side by side")
        lines.append(f"{place}. {row.name} {latency(row.stats.median_ns)} ({how})")
    return "\n".join(lines)
