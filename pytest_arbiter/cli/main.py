"""The ``pytest-arbiter`` console script: show, merge, diff and report caches; gate reports.

Exit codes: 0 pass, 1 gate failed (or ``merge --fail-on-conflict`` met a conflict),
2 usage error, an input that cannot be read, or an internal error. An unreadable input
is never taken for "no new degrades". The work is done by the library; this module
parses arguments and prints, every line escaped (:mod:`pytest_arbiter.store.safetext`): the
names in it come from runners' files.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import itertools
import json
import os
import sys
import textwrap
import traceback
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, TextIO

from pytest_arbiter.cli.parser import command_parser
from pytest_arbiter.cli.show_rows import (
    NARROW_COLUMNS,
    PAIRED_NOTE,
    SHOW_WIDTH,
    Columns,
    format_ns,
    narrow_columns,
    ns_cells,
    paired_only,
    row_columns,
    slower,
)
from pytest_arbiter.errors import ArtifactError, ReportUnavailable
from pytest_arbiter.gating import histogram_file
from pytest_arbiter.gating.baseline import (
    GATE_REMEDY,
    FleetVerdict,
    dispatched,
    failing_outcomes,
    first_keys,
    gate_fleet,
    tightened,
)
from pytest_arbiter.gating.histogram import STALE, AnyCounts, HistogramKey
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, CacheKey, plain_key
from pytest_arbiter.store.corpus import KeyChange, WinnerChange
from pytest_arbiter.store.corpus_files import Kind, diff_files, merge_files
from pytest_arbiter.store.safetext import (
    counted,
    escape,
    line as safe_line,
    lines as safe_lines,
)

if TYPE_CHECKING:
    from pytest_arbiter.gating.junit import FleetCounts

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
MAX_TESTS_SHOWN = 10
MAX_REASONS_SHOWN = 3
"""Distinct reasons ``gate`` prints under a new entry; the rest are counted."""
MAX_LISTED = 20
"""Known, fixed and unchecked entries ``gate`` lists of each kind, the first in key
order, the rest counted in one line (``--verbose`` lists every one): a fleet's gate
may know half a million entries, which no CI log should print."""


def _key_text(key: Sequence[str]) -> str:
    return "/".join(key)


def _entry_key(key: HistogramKey) -> str:
    return f"target={key.target} op={key.op} candidate={key.selected}"


def _say(out: TextIO, text: str) -> None:
    """Write one line of output. Names in it come from runners' files: every character
    that is not printable is escaped, and a line cannot start a CI log command."""
    out.write(safe_line(text) + "\n")


SAID_AT_ONCE = 8192
"""Lines :func:`_say_all` checks and writes at a time."""


def _say_all(out: TextIO, texts: Iterable[str]) -> None:
    """:func:`_say` of each of ``texts``, a few thousand lines checked and written at a
    time (most need no escape: one C pass tells)."""
    it = iter(texts)
    while chunk := tuple(itertools.islice(it, SAID_AT_ONCE)):
        out.write(safe_lines(chunk))


# -- show ------------------------------------------------------------------------------


SHOW_COLUMNS = ("device", "target", "op", "bucket", "dtype", "winner", "median",
                "runner-up", "samples", "spread", "confidence", "host", "measured")


def _show_row(e: CacheEntry) -> tuple[str, ...]:
    best = e.ranking[0].stats
    second = e.ranking[1] if len(e.ranking) > 1 else None
    ratio = None if second is None else e.over_winner(second)
    if second is not None and second.carried:
        runner = f"{second.name} (carried: not timed with the winner)"
    elif second is not None and ratio is not None:
        runner = f"{second.name} {slower(ratio, e.tie)}"
    else:
        runner = "-"
    conf = (f"{e.confidence:.3f}" + (" tie" if e.tie else "")
            + (" low-confidence" if e.low_confidence else ""))
    return (e.device, e.target, e.op, e.bucket, e.dtype, e.winner, format_ns(best.median_ns),
            runner, str(best.samples), f"{e.spread * 100:.1f}%", conf,
            e.provenance.host or "-", e.provenance.measured_at or "-")


class _ShownBlock(NamedTuple):
    """What ``show`` keeps of a block of entries: its rows as columns of cells
    (escaped), the widest cell of each column, and what the summary needs."""

    columns: list[list[str]]
    widths: list[int]
    devices: set[str]
    low: int
    paired: bool


def _escaped_rows(rows: Iterable[Sequence[str]]) -> Iterator[Sequence[str]]:
    """Each row with its cells escaped (one C call checks a whole row: most rows have
    nothing to escape)."""
    for row in rows:
        yield row if "".join(row).isprintable() else tuple(map(escape, row))


def _widths(columns: list[list[str]]) -> list[int]:
    """The widest cell of each column (none: no rows)."""
    return [max(map(len, column)) for column in columns] if columns[0] else []


def _print_blocks(blocks: Sequence[tuple[list[list[str]], list[int]]], out: TextIO) -> None:
    """The rows of ``blocks``, each column padded to its widest cell in any block."""
    widths: list[int] = []
    for _, seen in blocks:
        if seen:
            widths = list(map(max, widths, seen)) if widths else seen
    row = "  ".join(f"{{:<{width}}}" for width in widths).format  # str.ljust's padding
    for columns, seen in blocks:
        if seen:
            _say_all(out, map(str.rstrip, map(row, *columns)))


def cmd_show(args: argparse.Namespace, out: TextIO) -> int:
    if args.json:
        from pytest_arbiter.store.cache_json import json_block_chunks

        parts: Iterable[list[CacheEntry]] = artifacts.ordered_blocks(args.cache,
                                                                     shared=False)
        if args.device is not None or args.op is not None:
            parts = ([e for e in block if _shown(args, e)] for block in parts)
        binary = getattr(out, "buffer", None)  # a real stdout: no text round trip
        if binary is not None:
            out.flush()
            binary.writelines(json_block_chunks(parts))
            binary.flush()
        else:
            out.writelines(chunk.decode("ascii") for chunk in json_block_chunks(parts))
        return EXIT_OK
    wide = args.wide

    def work(block: list[CacheEntry]) -> _ShownBlock:
        if args.device is not None or args.op is not None:
            block = [e for e in block if _shown(args, e)]
        lows = list(map(_LOW, block))
        if wide:
            shown = Columns(row_columns(_escaped_rows(map(_show_row, block)),
                                        len(SHOW_COLUMNS)), any(map(paired_only, block)))
        else:
            shown = narrow_columns(block, lows)
        return _ShownBlock(shown.cells, _widths(shown.cells), set(map(_DEVICE, block)),
                           lows.count(True), shown.paired)

    blocks = artifacts.each_block(args.cache, work, shared=False)
    count = sum(len(b.columns[0]) for b in blocks)
    if not count:
        _say(out, _nothing_shown(args))
        return EXIT_OK
    header = SHOW_COLUMNS if wide else NARROW_COLUMNS
    _print_blocks([([[name] for name in header], list(map(len, header))),
                   *((b.columns, b.widths) for b in blocks)], out)
    if any(b.paired for b in blocks):
        _say(out, PAIRED_NOTE)
    devices = sorted(set().union(*(b.devices for b in blocks)))
    low = sum(b.low for b in blocks)
    summary = (f"{counted(count, 'entry', 'entries')} on {counted(len(devices), 'device')} "
               f"({', '.join(devices)})")
    if wide or len(summary) <= SHOW_WIDTH:
        _say(out, summary)
    else:  # the devices' tags on lines of their own, within the 100 columns
        _say(out, f"{counted(count, 'entry', 'entries')} on "
                  f"{counted(len(devices), 'device')}:")
        _say_all(out, textwrap.wrap(", ".join(devices), SHOW_WIDTH,
                                    initial_indent="  ", subsequent_indent="  ",
                                    break_on_hyphens=False))
    if low:
        _say(out, f"{counted(low, 'entry', 'entries')} low-confidence: the next "
             "--arbiter-tune measures them again")
    return EXIT_OK


_LOW = attrgetter("low_confidence")
_DEVICE = attrgetter("device")


def _shown(args: argparse.Namespace, e: CacheEntry) -> bool:
    """Whether ``show``'s ``--device`` and ``--op`` pick ``e``."""
    return ((args.device is None or args.device in (e.device, e.target))
            and (args.op is None or e.op == args.op))


def _nothing_shown(args: argparse.Namespace) -> str:
    """Why ``show`` lists nothing: the file has no entries, or the filters match none
    (then which devices and ops it does hold: a tag is longer than its target's name)."""
    if args.device is None and args.op is None:
        return f"{args.cache}: no entries"
    every = artifacts.read_entries(args.cache)
    if not every:
        return f"{args.cache}: no entries"
    asked = " ".join(f"--{name} {value}" for name, value in
                     (("device", args.device), ("op", args.op)) if value is not None)
    devices = ", ".join(sorted({e.device for e in every}))
    ops = ", ".join(sorted({e.op for e in every}))
    return (f"{args.cache}: no entry matches {asked} (devices: {devices}; ops: {ops})")


# -- merge -----------------------------------------------------------------------------


def cmd_merge(args: argparse.Namespace, out: TextIO) -> int:
    out_path = Path(args.output)
    # OUT is read under its lock by merge_files
    shards = [s for s in args.shards if Path(s).resolve() != out_path.resolve()]
    result = merge_files(out_path, shards)
    for conflict in result.conflicts:
        _say(out, conflict.describe())
    _say(out, f"{out_path}: {result.entries} entries after merging "
         f"{len(args.shards)} shard(s); {len(result.conflicts)} conflict(s)")
    if result.conflicts and args.fail_on_conflict:
        return EXIT_FAILED
    return EXIT_OK


# -- diff ------------------------------------------------------------------------------


def cmd_diff(args: argparse.Namespace, out: TextIO) -> int:
    d = diff_files(args.old, args.new, _diff_line, _diff_run)
    _say_all(out, itertools.chain(d.changed, d.added, d.removed))
    _say(out, f"{counted(len(d.changed), 'winner')} changed, "
         f"{counted(len(d.added), 'key')} added, {len(d.removed)} removed, "
         f"{d.same} unchanged")
    return EXIT_OK


def _diff_line(change: WinnerChange | KeyChange) -> str:
    """``diff``'s line of a changed winner, or of a key added or removed."""
    if isinstance(change, WinnerChange):
        low = _NEW_LOW if change.new.low_confidence else _NEW_TIE if change.new.tie else ""
        return (f"changed {_key_text(change.key)}: {change.old.winner} "
                f"({format_ns(change.old_ns)}) -> {change.new.winner} "
                f"({format_ns(change.new_ns)}, {change.change * 100:+.1f}%)"
                f"{_beat(change)}{low}")
    entry = change.entry
    if change.old is None:
        return (f"added {_key_text(plain_key(entry))}: {entry.winner} "
                f"({format_ns(entry.ranking[0].stats.median_ns)})")
    return f"removed {_key_text(plain_key(entry))}: {entry.winner}"


def _diff_run(kind: Kind, old: list[CacheEntry], new: list[CacheEntry]) -> list[str]:
    """:func:`_diff_line` of each of a run of changes of one kind, a column at a time."""
    entries = old if kind == "removed" else new
    keys = list(map("/".join, map(plain_key, entries)))
    firsts = list(map(_FIRST, map(_RANKING, entries)))
    winners = list(map(_NAME, firsts))
    if kind == "removed":
        return list(map("removed {}: {}".format, keys, winners))
    medians = list(map(_MEDIAN, firsts))
    if kind == "added":
        return list(map("added {}: {} ({})".format, keys, winners, ns_cells(medians)))
    olds = list(map(_FIRST, map(_RANKING, old)))
    before = list(map(_MEDIAN, olds))
    changes = [f"{(n / o - 1.0 if o > 0 else 0.0) * 100:+.1f}%"
               for o, n in zip(before, medians, strict=True)]
    beats = [_beat(WinnerChange(CacheKey._make(k), a, b))
             for k, a, b in zip(map(plain_key, new), old, new, strict=True)]
    lows = [_NEW_LOW if low else _NEW_TIE if tie else ""
            for low, tie in zip(map(_LOW, new), map(_TIE, new), strict=True)]
    return list(map("changed {}: {} ({}) -> {} ({}, {}){}{}".format, keys,
                    map(_NAME, olds), ns_cells(before), winners, ns_cells(medians),
                    changes, beats, lows))


def _beat(change: WinnerChange) -> str:
    """How the old winner did in the new measurement (:func:`_diff_line`'s)."""
    margin = change.margin  # the old winner's ratio to the new one, less 1
    return (f"; {change.old.winner} not timed in NEW" if margin is None
            else f"; {change.old.winner} now {abs(margin) * 100:.1f}% "
            f"{'slower' if margin >= 0 else 'faster'}")


_NEW_LOW = "; new pick low-confidence"
_NEW_TIE = "; new pick a tie (the higher tier, within 1% in NEW)"
_TIE = attrgetter("tie")
_RANKING = attrgetter("ranking")
_FIRST = itemgetter(0)
_NAME = attrgetter("name")
_MEDIAN = attrgetter("stats.median_ns")


# -- forget ----------------------------------------------------------------------------


def cmd_forget(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_arbiter.store.corpus import ForgetFilter

    cutoffs = [c for c in (args.before, None if args.older_than is None
                           else datetime.datetime.now(datetime.timezone.utc) - args.older_than)
               if c is not None]
    selection = ForgetFilter(args.device, args.op, args.candidate,
                          min(cutoffs) if cutoffs else None)
    if selection.empty and not args.all:
        sys.stderr.write("pytest-arbiter forget: error: name what to forget (--device, --op, "
                         "--candidate, --older-than, --before), or --all for every entry\n")
        return EXIT_USAGE
    if args.all and not selection.empty:
        sys.stderr.write("pytest-arbiter forget: error: --all forgets every entry: it "
                         "takes no other filter\n")
        return EXIT_USAGE
    # with a time filter, the entries the other filters pick whose age is unknown: kept
    untimed = ForgetFilter(args.device, args.op, args.candidate)
    undated = 0

    def picks(entry: CacheEntry) -> bool:
        nonlocal undated
        if selection.measured_before is not None and selection.measured_at(entry) is None:
            undated += untimed.picks(entry)
            return False
        return selection.picks(entry)

    def again() -> None:
        nonlocal undated
        undated = 0

    # without a time filter, the filter itself: one call an entry, not two
    chooser = picks if selection.measured_before is not None else selection.picks
    gone, remain = artifacts.forget_entries(args.cache, chooser, dry_run=args.dry_run,
                                            timeout=args.lock_timeout, again=again)
    verb = "would forget" if args.dry_run else "forgot"
    _say_all(out, (f"{verb} {_key_text(plain_key(entry))}: winner {entry.winner}, measured "
                   f"{entry.provenance.measured_at or 'at an unknown time'}" for entry in gone))
    if undated:
        _say(out, f"kept {undated} entries that match but do not say when they were "
             "measured (no provenance.measured_at): their age is unknown")
    if args.dry_run:
        _say(out, f"{args.cache}: {len(gone)} entries would be removed, {remain} would "
             "remain (dry run: nothing written)")
    elif gone:
        _say(out, f"{args.cache}: removed {len(gone)} entries, {remain} remain")
    else:
        _say(out, f"{args.cache}: no entry matches; nothing removed, {remain} remain")
    if not gone and remain and args.device is not None:  # a tag mistyped: the ones it has
        devices = sorted(artifacts.read_cache(args.cache).devices())
        _say(out, f"{args.cache}: its devices: {', '.join(devices)}")
    return EXIT_OK


# -- gate ------------------------------------------------------------------------------


def _new_entry_lines(fleet: FleetCounts, new: Mapping[HistogramKey, int]) -> Iterator[str]:
    """A line per new failing entry, naming its tests, and under it the reasons its
    JUnit reports record (none from a histogram file)."""
    from pytest_arbiter.gating.junit import ids_for, reasons_for

    tests = ids_for(fleet, new)
    for key, count in sorted(new.items()):
        ids = tests[key]
        shown = ", ".join(ids[:MAX_TESTS_SHOWN])
        more = f" (+{len(ids) - MAX_TESTS_SHOWN} more)" if len(ids) > MAX_TESTS_SHOWN else ""
        dispatches = counted(count, "dispatch", "dispatches")
        yield (f"NEW {key.outcome}: {_entry_key(key)} ({dispatches}) in "
               f"{shown or 'no recorded test'}{more}")
        reasons = reasons_for(fleet, key) if fleet.reasons else []
        yield from (f"  reason: {why}" for why in reasons[:MAX_REASONS_SHOWN])
        if len(reasons) > MAX_REASONS_SHOWN:
            yield f"  (+{len(reasons) - MAX_REASONS_SHOWN} more reasons)"


def _first(keys: Iterable[HistogramKey], count: int, verbose: bool) -> list[HistogramKey]:
    """The keys ``gate`` lists of ``count``: all of them, sorted, with ``verbose`` or when
    they are few, else the first :data:`MAX_LISTED` in key order (not a sort of all)."""
    return first_keys(keys, None if verbose or count <= MAX_LISTED else MAX_LISTED)


def _rest(kind: str, count: int, shown: int, what: str) -> Iterator[str]:
    """The line that counts the entries of one kind left out of the list."""
    if count > shown:
        yield f"{kind}: +{count - shown} more {what}; --verbose lists each"


def _known_lines(known: Mapping[HistogramKey, int], verbose: bool) -> Iterator[str]:
    """A line per known entry listed (the key unpacked, not a call each: with
    ``--verbose``, up to a million), then how many more there are."""
    keys = _first(known, len(known), verbose)
    yield from (f"known {outcome}: target={target} op={op} candidate={selected} ({count} "
                f"{'dispatch' if count == 1 else 'dispatches'}, in the baseline)"
                for (target, op, selected, outcome), count in zip(
                    keys, map(known.__getitem__, keys), strict=True))
    yield from _rest("known", len(known), len(keys), "entries in the baseline (they pass)")


def _unchecked(key: HistogramKey, dispatched: bool) -> str:
    """Why no report proves a baseline entry fixed."""
    if not dispatched:
        return f"no report dispatched {key.target}/{key.op}"
    if key.outcome == STALE:
        return "no report rechecked it"
    return f"no report checked {key.selected} (unavailable, or not reached)"


def _fixed_lines(fv: FleetVerdict, update: bool, verbose: bool, seen: AnyCounts
                 ) -> Iterator[str]:
    """A line per fixed, then per unchecked, entry listed, each kind's rest counted."""
    fixed = ("removed from the baseline)" if update
             else "tighten the baseline with --update)")
    listed = _first(fv.fixed, len(fv.fixed), verbose)
    yield from (f"fixed {outcome}: target={target} op={op} candidate={selected} (no longer "
                f"seen; {fixed}" for target, op, selected, outcome in listed)
    yield from _rest("fixed", len(fv.fixed), len(listed),
                     f"entries no longer seen ({fixed[:-1]})")
    listed = _first(fv.unchecked, len(fv.unchecked), verbose)
    yield from (f"unchecked {key.outcome}: {_entry_key(key)} ({_unchecked(key, ran)}: "
                "kept in the baseline)"
                for key, ran in zip(listed, dispatched(seen, listed), strict=True))
    yield from _rest("unchecked", len(fv.unchecked), len(listed),
                     "entries no report checked (kept in the baseline)")


def _gate_baseline(path: str | None) -> tuple[Mapping[HistogramKey, int], str]:
    """The baseline ``gate`` compares with, and the note that says what it was."""
    if path is None:
        return {}, "no --baseline given: every degraded, rejected or error entry is new"
    baseline_path = Path(path)
    if not baseline_path.exists():
        return {}, f"baseline {baseline_path} does not exist yet: it counts as empty"
    baseline = histogram_file.read_columns(baseline_path)
    return baseline, f"baseline {baseline_path}: {len(baseline)} entries"


def cmd_gate(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_arbiter.gating.junit import read_reports

    if args.update and args.baseline is None:
        sys.stderr.write("pytest-arbiter gate: error: --update tightens the --baseline "
                         "file: name it\n")
        return EXIT_USAGE
    fleet = read_reports(args.inputs, allow_no_data=args.allow_no_data)
    baseline, note = _gate_baseline(args.baseline)
    run = fleet.gated()
    failing = failing_outcomes(stale=args.stale == "fail")
    fv = gate_fleet(run, baseline, failing=failing, evidence=fleet.evidence(),
                    dispatched=fleet.counts)
    _say(out, f"read {counted(len(fleet.sources), 'report')}, "
         f"{counted(fleet.testcases, 'testcase')}, "
         f"{counted(len(fleet.counts), 'dispatch entry', 'dispatch entries')}; {note}")
    for path in fleet.repeated:
        _say(out, f"{escape(path)}: named twice, read once")
    if not fleet.counts:
        _say(out, "warning: the reports hold no pytest-arbiter dispatch data "
             "(was the plugin active? did any test dispatch?)")
    _say_all(out, _new_entry_lines(fleet, fv.verdict.new))
    _say_all(out, _known_lines(fv.verdict.known, args.verbose))
    _say_all(out, _fixed_lines(fv, args.update, args.verbose, fleet.counts))
    if args.update:
        baseline_path = Path(args.baseline)
        histogram_file.write_histogram(baseline_path, tightened(baseline, fv.fixed))
        _say(out, f"wrote the tightened baseline {baseline_path} "
             f"({counted(len(fv.fixed), 'fixed entry', 'fixed entries')} removed)")
    stale = [line for _, line in fleet.stale]
    if stale and args.stale != "fail":
        _say(out, f"{len(stale)} stale cached winner(s) reported, not gated (--stale=fail "
             "gates them; 'pytest-arbiter stale' lists them)")
    if not fv.passed:
        _say(out, f"degrade gate FAILED: {len(fv.verdict.new)} new "
             f"{' or '.join([', '.join(failing[:-1]), failing[-1]])} entries "
             f"({GATE_REMEDY})")
        return EXIT_FAILED
    _say(out, f"degrade gate passed "
         f"({counted(len(fv.verdict.known), 'known gated entry', 'known gated entries')})")
    return EXIT_OK


# -- stale ----------------------------------------------------------------------------


def cmd_stale(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_arbiter.gating.junit import read_reports

    fleet = read_reports(args.inputs)
    by_key: dict[str, list[str]] = {}
    for source, line in fleet.stale:
        key, _, found = line.partition(": ")
        by_key.setdefault(key, []).append(f"{source}: {found}")
    if args.json:
        out.write(json.dumps([{"key": key, "found": lines}
                              for key, lines in sorted(by_key.items())], indent=1) + "\n")
        return EXIT_OK
    _say(out, f"read {counted(len(fleet.sources), 'report')}: "
         f"{counted(len(by_key), 'stale key')}")
    for key, lines in sorted(by_key.items()):
        _say(out, key)
        for text in lines:
            _say(out, f"  {text}")
    return EXIT_OK


# -- report ----------------------------------------------------------------------------


def cmd_report(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_arbiter.cli import report
    from pytest_arbiter.gating.junit import read_report

    if args.history:
        return _report_history(args, out)
    histograms = [report.HistogramInput.of(str(path), read_report(path))
                  for path in args.histograms]
    try:
        # the corpus read a block at a time: the page keeps what it shows, not every entry
        page, count = report.render_file(args.cache, histograms, corpus=str(args.cache))
    except ReportUnavailable as exc:
        sys.stderr.write(f"pytest-arbiter report: {exc}\n")
        return EXIT_USAGE
    artifacts.write_text_atomic(args.output, page)
    _say(out, f"{args.output}: {counted(count, 'entry', 'entries')}, "
         f"{counted(len(histograms), 'report')} (JUnit or histogram)")
    return EXIT_OK


def _report_history(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_arbiter.cli import report_history

    if args.histograms:
        sys.stderr.write("pytest-arbiter report: --history reads the corpus's git history "
                         "only: give no REPORT files\n")
        return EXIT_USAGE
    try:
        versions = report_history.read_versions(args.cache, args.max_commits)
        page = report_history.render_history(str(args.cache), versions)
    except ReportUnavailable as exc:
        sys.stderr.write(f"pytest-arbiter report: {exc}\n")
        return EXIT_USAGE
    artifacts.write_text_atomic(args.output, page)
    _say(out, f"{args.output}: {len(versions)} versions of {args.cache}, "
         f"{report_history.change_count(versions)} winner changes, slowdowns and removals")
    return EXIT_OK


# -- export ----------------------------------------------------------------------------


def cmd_export(args: argparse.Namespace, out: TextIO) -> int:
    from pytest_arbiter.store import benchmark_json

    cache = artifacts.read_cache(args.cache)
    entries = [e for e in cache.entries() if _shown(args, e)]  # show's --device and --op
    if not entries and (args.device is not None or args.op is not None):
        sys.stderr.write(f"pytest-arbiter export: {safe_line(_nothing_shown(args))}\n")
    if args.output is None:
        doc = benchmark_json.document(entries)
        out.write(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n")
        return EXIT_OK
    count = benchmark_json.write(Path(args.output), entries)
    _say(out, f"{args.output}: {count} benchmarks from {len(entries)} entries "
         "(pytest-benchmark JSON)")
    return EXIT_OK


# -- wiring ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (:mod:`pytest_arbiter.cli.parser`), each command run by
    its ``cmd_*`` function here."""
    return command_parser({
        "show": cmd_show, "merge": cmd_merge, "diff": cmd_diff, "forget": cmd_forget,
        "gate": cmd_gate, "stale": cmd_stale, "report": cmd_report, "export": cmd_export})


QUIET_ON_BROKEN_PIPE = frozenset({"show", "diff", "report", "export"})
"""Commands whose output a reader may cut short (``| head``): a pass, not an error."""


def _reader_gone(stream: TextIO, command: str) -> int:
    """The reader of the output closed it (``pytest-arbiter show ... | head``): exit
    quietly, as Python's documentation on SIGPIPE recommends, by pointing the output at
    the null device so that the interpreter's last flush cannot fail again. A gate whose
    verdict was not read out exits 2: a cut-off gate never passes."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = -1
    if fd >= 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
    return EXIT_OK if command in QUIET_ON_BROKEN_PIPE else EXIT_USAGE


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the CLI; returns the exit code (argparse's own exits are returned too)."""
    stream = out if out is not None else sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    # A short-lived process over large acyclic data: the cyclic collector would only
    # rescan the loaded entries again and again.
    gc.disable()
    try:
        code: int = args.run(args, stream)
        stream.flush()
        return code
    except BrokenPipeError:
        return _reader_gone(stream, args.command)
    except ArtifactError as exc:
        sys.stderr.write(f"pytest-arbiter {args.command}: error: {escape(exc)}\n")
        return EXIT_USAGE
    except Exception as exc:
        # a bug, not a verdict: exit 1 (what an uncaught traceback gives) means "the gate
        # failed"; the traceback is kept for the report, escaped like all output
        sys.stderr.write(f"pytest-arbiter {args.command}: internal error: "
                         f"{escape(type(exc).__name__)}: {escape(exc)}\n")
        for text in traceback.format_exc().splitlines():
            sys.stderr.write(safe_line(text) + "\n")
        return EXIT_USAGE
    finally:
        gc.enable()


if __name__ == "__main__":
    sys.exit(main())
