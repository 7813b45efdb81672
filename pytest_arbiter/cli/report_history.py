"""``pytest-arbiter report --history``: how each key's winner and median changed across
the commits of a corpus file.

git gives the commits that changed the file (across renames) and the file at each
(:mod:`pytest_arbiter.cli.report_git`); the working tree's file is the last version
when it differs from its last commit. The page lists every winner change and every
slowdown (a median :data:`SLOWER` or more above the key's previous version, with the same
winner), then per device and op a chart of each key's median over the versions
(matplotlib, inline SVG, a changed winner drawn as a diamond) and a table of every key
by version, its marks in words. Self-contained and escaped like the report itself.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pytest_arbiter.cli.report import page, table
from pytest_arbiter.cli.report_cells import breakable, latency, natural, text
from pytest_arbiter.cli.report_git import Commit, changed_since_commit, commits, version
from pytest_arbiter.cli.report_history_chart import chart_svg
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store.cache import KeyTuple, plain_key
from pytest_arbiter.store.cache_file import decode_document
from pytest_arbiter.store.corpus import cache_of
from pytest_arbiter.store.safetext import counted, escape

MAX_COMMITS = 50
"""Versions shown by default: the newest."""
SLOWER = 1.10
"""A median this many times the key's previous one (same winner) is a slowdown."""

Change = Literal["new", "winner", "slower", "faster", "same", "gone"]
MARK_WORDS: dict[Change, str] = {"new": "new key", "winner": "new winner",
                                 "slower": "slower", "faster": "faster", "same": "",
                                 "gone": "removed"}


@dataclass(frozen=True)
class Version:
    """The corpus file at one commit (``commit`` ``None``: the working tree)."""

    label: str
    commit: Commit | None
    medians: dict[KeyTuple, tuple[str, float]]
    """Each key's winner and median."""
    error: str = ""
    """Why this version could not be read (then ``medians`` is empty)."""


@dataclass(frozen=True)
class Point:
    """One key at one version, and how it changed since the key's previous version."""

    winner: str
    median_ns: float
    change: Change
    before: tuple[str, float] | None = None


def _version(label: str, commit: Commit | None, data: bytes | None) -> Version:
    if data is None:
        return Version(label, commit, {}, "the commit deleted the file")
    try:
        cache = cache_of(decode_document(data, source=f"{label}"))
    except ValueError as exc:
        return Version(label, commit, {}, escape(exc))
    return Version(label, commit, {plain_key(e): (e.winner, e.ranking[0].stats.median_ns)
                                   for e in cache.entries()})


def read_versions(path: str | os.PathLike[str], limit: int = MAX_COMMITS) -> list[Version]:
    """The file's versions, oldest first: its newest ``limit`` commits, then the working
    tree's file if it differs. ``ArtifactError`` outside git or with no commit."""
    found = commits(path, limit=limit)
    if not found:
        raise ArtifactError(f"{escape(path)} has no committed version (git log finds "
                            "none): commit it, then its history grows with each commit")
    folder = Path(path).resolve().parent
    out = [_version(c.short, c, version(c, folder)) for c in reversed(found)]
    if os.path.exists(path) and changed_since_commit(path):
        with open(path, "rb") as file:
            out.append(_version("working tree", None, file.read()))
    return out


def series(versions: Sequence[Version]) -> dict[KeyTuple, list[Point | None]]:
    """Each key's point at each version (``None``: not in that version)."""
    keys = sorted({k for v in versions for k in v.medians},
                  key=lambda k: (k[0], k[2], natural(k[3]), k[4], k[1]))
    out: dict[KeyTuple, list[Point | None]] = {}
    for key in keys:
        points: list[Point | None] = []
        last: tuple[str, float] | None = None
        for v in versions:
            now = v.medians.get(key)
            if now is None:
                if v.error or last is None:  # unreadable, or not there yet
                    points.append(None)
                else:
                    points.append(Point(*last, "gone", last))
                    last = None
                continue
            points.append(Point(*now, _change(last, now), last))
            last = now
        out[key] = points
    return out


def _change(before: tuple[str, float] | None, now: tuple[str, float]) -> Change:
    if before is None:
        return "new"
    if before[0] != now[0]:
        return "winner"
    if before[1] > 0 and now[1] >= before[1] * SLOWER:
        return "slower"
    if now[1] > 0 and before[1] >= now[1] * SLOWER:
        return "faster"
    return "same"


def _change_text(p: Point) -> str:
    if p.before is None or p.change in ("same", "new"):
        return MARK_WORDS[p.change]
    if p.change == "gone":
        return "removed from the corpus"
    was, median = p.before
    if p.change == "winner":
        return (f"new winner: {was} ({latency(median)}) to {p.winner} "
                f"({latency(p.median_ns)})")
    return (f"{p.change}: {latency(median)} to {latency(p.median_ns)} "
            f"({(p.median_ns / median - 1) * 100:+.0f}%)") if median > 0 else p.change


def _header(path: str, versions: Sequence[Version], now: datetime.datetime) -> list[str]:
    rows = [f"<tr>{_td(v.label)}{_td(v.commit.date[:16].replace('T', ' ') if v.commit else '-')}"
            f"{_td(v.commit.author if v.commit else '-')}"
            f"{_td(v.commit.subject if v.commit else 'not committed')}"
            f"{_td(v.error or counted(len(v.medians), 'entry', 'entries'))}</tr>"
            for v in reversed(versions)]
    return ["<header>", f"<h1>History of {text(path)}</h1>",
            f"<p>Generated {now:%Y-%m-%d %H:%M} UTC from git: "
            f"{counted(len(versions), 'version')} of the corpus, oldest "
            f"{text(versions[0].label)}, newest {text(versions[-1].label)}. A median "
            f"{(SLOWER - 1) * 100:.0f}% or more above the key's previous version with the "
            "same winner is marked slower.</p>", "</header>",
            '<section id="versions"><h2>Versions</h2>',
            *table(["commit", "date", "author", "subject", "entries"], rows, "versions"),
            "</section>"]


def _td(value: object) -> str:
    return f"<td>{text(value)}</td>"


def _changes(keyed: dict[KeyTuple, list[Point | None]],
             versions: Sequence[Version]) -> list[str]:
    rows = [f'<tr class="{p.change}"><td class="mark">{text(_change_text(p))}</td>'
            f'<td>{breakable("/".join(key))}</td>{_td(v.label)}</tr>'
            for key, points in keyed.items()
            for v, p in zip(versions, points, strict=True)
            if p is not None and p.change in ("winner", "slower", "gone")]
    out = ['<section id="changes"><h2>Winner changes and slowdowns</h2>']
    if not rows:
        return [*out, '<p class="ok">None across these versions.</p>', "</section>"]
    out.append(f'<p class="bad">{counted(len(rows), "change")}.</p>')
    return [*out, *table(["what changed", "key", "version"], rows, "changes"),
            "</section>"]


def _cell(p: Point | None) -> str:
    """A key at one version: its winner and median, and what changed, in words."""
    if p is None:
        return "<td>-</td>"
    mark = f'<span class="mark">{text(MARK_WORDS[p.change])}</span>'
    if p.change == "gone":
        return f'<td class="gone">{mark}</td>'
    flagged = p.change in ("winner", "slower", "faster")
    return (f'<td class="{p.change}">{text(p.winner)}<br>{text(latency(p.median_ns))}'
            + (f"<br>{mark}" if flagged else "") + "</td>")


def _group(device: str, op: str, keys: list[KeyTuple],
           keyed: dict[KeyTuple, list[Point | None]], versions: Sequence[Version],
           anchor: str) -> list[str]:
    labels = [v.label for v in versions]
    lines = {f"{k[3]} {k[4]}": [None if p is None or p.change == "gone"
                                else (p.median_ns, p.change == "winner")
                                for p in keyed[k]] for k in keys}
    rows = []
    for k in keys:
        cells = "".join(map(_cell, keyed[k]))
        rows.append(f"<tr><td>{breakable(k[3])}</td><td>{breakable(k[4])}</td>{cells}</tr>")
    return [f'<section class="group" id="{anchor}"><h2>{text(device)} \u00b7 {text(op)}'
            "</h2>", f'<figure class="trend">{chart_svg(lines, labels, anchor)}</figure>',
            *table(["bucket", "dtype", *map(text, labels)], rows, "history"), "</section>"]


def render_history(path: str, versions: Sequence[Version],
                   now: datetime.datetime | None = None) -> str:
    """The history page of ``versions`` (oldest first) of the corpus at ``path``."""
    keyed = series(versions)
    groups: dict[tuple[str, str], list[KeyTuple]] = {}
    for key in keyed:
        groups.setdefault((key[0], key[2]), []).append(key)
    body = _header(path, versions, now or datetime.datetime.now(datetime.timezone.utc))
    body += _changes(keyed, versions)
    for n, ((device, op), keys) in enumerate(sorted(groups.items())):
        body += _group(device, op, keys, keyed, versions, f"h-{n}")
    return page(f"pytest-arbiter history: {path}", body)


def change_count(versions: Sequence[Version]) -> int:
    """How many winner changes, slowdowns and removals the page lists."""
    return sum(1 for points in series(versions).values() for p in points
               if p is not None and p.change in ("winner", "slower", "gone"))
