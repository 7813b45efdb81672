"""The ``pytest-arbiter`` command line's grammar: its commands, their arguments and help.

:func:`command_parser` is given the function that runs each command
(:mod:`pytest_arbiter.cli.main`'s ``cmd_*``); argparse calls the argument types below.
"""

from __future__ import annotations

import argparse
import datetime
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TextIO

from pytest_arbiter import __version__
from pytest_arbiter.gating.histogram import GATED_OUTCOMES
from pytest_arbiter.store.artifacts import LOCK_TIMEOUT_S
from pytest_arbiter.store.corpus import CONFLICT_RULE, MERGE_RULE
from pytest_arbiter.store.safetext import escape

Command = Callable[[argparse.Namespace, TextIO], int]
"""A command's function: the parsed arguments and the output stream to the exit code."""
if TYPE_CHECKING:  # not subscriptable at run time
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

DESCRIPTION = """\
Work with pytest-arbiter's artifacts: the measured-winner cache (corpus) and the
dispatch reports a fleet of CI runners writes.

exit codes: 0 pass, 1 gate failed, 2 usage error or unreadable input"""


# -- argument types --------------------------------------------------------------------

_AGE = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def _age(text: str) -> datetime.timedelta:
    """``30d``, ``12h``, ``90m``, ``2w``, ``45s``: an age (argparse's ``type``)."""
    found = _AGE.fullmatch(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{escape(repr(text))} is not an age: a number and a unit, s, m, h, d or w "
            "(30d, 12h)")
    try:
        return datetime.timedelta(seconds=float(found.group(1)) * _UNIT_S[found.group(2)])
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{escape(repr(text))} is too long ago") from None


def _date(text: str) -> datetime.datetime:
    """``2026-11-01`` (midnight UTC) or an RFC 3339 time (``2026-11-01T06:00:00Z``; UTC
    when it has no offset): a moment (argparse's ``type``)."""
    import msgspec

    try:
        day = msgspec.convert(text.strip(), datetime.date)
        return datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.timezone.utc)
    except msgspec.ValidationError:
        pass
    try:
        when = msgspec.convert(text.strip(), datetime.datetime)
    except msgspec.ValidationError:
        raise argparse.ArgumentTypeError(
            f"{escape(repr(text))} is not a date (2026-11-01) or a time "
            "(2026-11-01T06:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.astimezone(datetime.timezone.utc)


def _name(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("an empty name matches no entry")
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{escape(repr(text))} is not a number of seconds")
    return value


def _positive_int(text: str) -> int:
    if not text.isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{escape(repr(text))} is not a positive integer")
    return int(text)


# -- the commands ----------------------------------------------------------------------


# -- wiring ----------------------------------------------------------------------------


def command_parser(commands: Mapping[str, Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pytest-arbiter", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_cache_commands(sub, commands)
    _add_forget(sub, commands)
    _add_fleet_commands(sub, commands)
    _add_output_commands(sub, commands)
    return parser


def _add_cache_commands(sub: Subparsers, commands: Mapping[str, Command]) -> None:
    """``show``, ``merge`` and ``diff``: read, combine and compare caches."""
    show = sub.add_parser("show", help="print a cache as a table (or JSON)",
                          description="Print the entries of a cache artifact, one row per "
                          "key: winner, its median, the runner-up, the evidence.")
    show.add_argument("cache", metavar="CACHE", help="a cache artifact (JSON)")
    show.add_argument("--json", action="store_true",
                      help="print the entries as JSON (self-contained, one object each)")
    show.add_argument("--device", metavar="TAG",
                      help="only entries of this device tag, or of this target (cpu, "
                           "nvidia, amd: all its devices)")
    show.add_argument("--op", help="only entries of this op")
    show.add_argument("--wide", action="store_true",
                      help="every column (target, samples, spread, host, measured), "
                      "uncut; by default the table fits 100 columns")
    show.set_defaults(run=commands["show"])

    mrg = sub.add_parser(
        "merge", help="merge cache shards into a corpus",
        description="Merge cache shards into OUT under OUT's lock (OUT.lock); OUT is "
        "created if missing and may also be listed as a shard. OUT's current entries "
        "are kept unless the merge rule prefers a shard's entry for the same key: of two "
        f"entries it keeps the one with {', then '.join(MERGE_RULE)}. Conflicts are "
        f"printed: {CONFLICT_RULE}.")
    mrg.add_argument("-o", "--output", required=True, metavar="OUT",
                     help="the corpus to merge into (written atomically)")
    mrg.add_argument("shards", nargs="+", metavar="SHARD", help="cache artifacts to merge")
    mrg.add_argument("--fail-on-conflict", action="store_true",
                     help="exit 1 when the merge met a conflict")
    mrg.set_defaults(run=commands["merge"])

    dif = sub.add_parser("diff", help="winners that changed between two caches",
                         description="List the keys whose winner differs between OLD and "
                         "NEW with both medians and the change, then added and removed "
                         "keys.")
    dif.add_argument("old", metavar="OLD")
    dif.add_argument("new", metavar="NEW")
    dif.set_defaults(run=commands["diff"])


def _add_forget(sub: Subparsers, commands: Mapping[str, Command]) -> None:
    """``forget``: remove the entries that every given filter picks."""
    fgt = sub.add_parser(
        "forget", help="remove entries from a cache",
        description="Remove the entries of CACHE that every given filter picks, under "
        "CACHE's lock (CACHE.lock), and rewrite it atomically (through a symbolic link, "
        "at its target). Refuses to run without a filter unless --all is given. Says how "
        "many entries were removed and how many remain.")
    fgt.add_argument("cache", metavar="CACHE", help="the cache artifact to remove entries from")
    fgt.add_argument("--device", type=_name, help="entries of this device tag, or of this "
                     "target (cpu, nvidia, amd: all its devices)")
    fgt.add_argument("--op", type=_name, help="entries of this op")
    fgt.add_argument("--candidate", type=_name, metavar="NAME",
                     help="entries whose ranking, rejected or considered candidates name "
                     "NAME")
    fgt.add_argument("--older-than", type=_age, metavar="AGE",
                     help="entries measured (provenance.measured_at) more than AGE ago: "
                     "30d, 12h, 90m, 2w; an entry without measured_at is kept")
    fgt.add_argument("--before", type=_date, metavar="DATE",
                     help="entries measured before DATE (2026-11-01 is midnight UTC, or "
                     "2026-11-01T06:00:00Z)")
    fgt.add_argument("--all", action="store_true", help="every entry (and no other filter)")
    fgt.add_argument("--dry-run", action="store_true",
                     help="list what would be removed; write nothing")
    fgt.add_argument("--lock-timeout", type=_seconds, default=LOCK_TIMEOUT_S,
                     metavar="SECONDS", help="how long to wait for another writer's lock "
                     "(default %(default)g)")
    fgt.set_defaults(run=commands["forget"])


_GATED = f"{', '.join(GATED_OUTCOMES[:-1])} or {GATED_OUTCOMES[-1]}"
"""The outcomes the gate fails on, in words: ``degraded, rejected or error``."""


def _add_fleet_commands(sub: Subparsers, commands: Mapping[str, Command]) -> None:
    """``gate`` and ``stale``: what the fleet's JUnit reports and histograms found."""
    gate = sub.add_parser(
        "gate", help=f"fail on new {_GATED} dispatches across the fleet's reports",
        description="Merge the dispatch counts of JUnit XML reports (the arbiter:... "
        "properties pytest-arbiter records per test) and/or histogram JSON files "
        f"(--arbiter-histogram), and fail (exit 1) on a {_GATED} entry the baseline "
        "does not list, naming target, op, candidate and the tests that hit it. Exit 2 "
        "when an input cannot be read.")
    gate.add_argument("--baseline", default=None, metavar="BASELINE",
                      help="the committed histogram baseline (a missing file counts as "
                      "empty; without --baseline every gated entry is new, as in a "
                      "pytest run without --arbiter-baseline)")
    gate.add_argument("--update", action="store_true",
                      help="write the tightened baseline: fixed entries removed (new ones "
                      "are not added)")
    gate.add_argument("inputs", nargs="+", metavar="INPUT",
                      help="JUnit XML reports and/or histogram JSON files")
    gate.add_argument("--allow-no-data", action="append", default=[], metavar="FILE",
                      help="a JUnit report that may carry no pytest-arbiter data (a run "
                      "with the plugin off, on purpose); any other such report is an "
                      "error (exit 2): a runner whose degrades cannot be seen never "
                      "passes the gate silently. Repeat for several files")
    gate.add_argument("--stale", choices=("report", "fail"), default="report",
                      help="'fail': a 'stale' entry (a cached winner a recheck found "
                      "slower, --arbiter-recheck) the baseline does not list fails the "
                      "gate too (default: report)")
    gate.add_argument("-v", "--verbose", action="store_true",
                      help="list every known, fixed and unchecked entry (by default the "
                      "first few of each kind, the rest counted); new entries are always "
                      "listed in full")
    gate.set_defaults(run=commands["gate"])

    stl = sub.add_parser(
        "stale", help="list the stale cached winners the fleet's reports found",
        description="List the keys whose cached winner a recheck (pytest "
        "--arbiter-recheck) found slower than another candidate timed side by side, "
        "from the runners' JUnit XML reports, with what each runner found: the keys to "
        "re-tune.")
    stl.add_argument("inputs", nargs="+", metavar="REPORT", help="JUnit XML reports")
    stl.add_argument("--json", action="store_true",
                     help="print the keys as JSON: [{\"key\", \"found\"}]")
    stl.set_defaults(run=commands["stale"])


def _add_output_commands(sub: Subparsers, commands: Mapping[str, Command]) -> None:
    """``report`` and ``export``: a cache as an HTML page or in another tool's format."""
    rep = sub.add_parser(
        "report", help="write an HTML page of a cache: winners, medians, problems",
        description="Write one self-contained HTML page (no script, nothing loaded from "
        "the network, readable on a phone): a header with the date, the corpus and its "
        "last commit, versions and devices; per device and op, a heat map of shape "
        "bucket by dtype (each cell the winner and its median, coloured on one scale for "
        "the page: the winner's speedup over the runner-up; low-confidence and stale "
        "entries marked in words) and a table of every entry; the problem table "
        "(degraded, rejected, error, no_candidate and stale entries of the histograms and "
        "JUnit reports, with reasons, tests and keys); the entries due for "
        "re-measurement; the devices side by side. Needs matplotlib: "
        "pip install 'pytest-arbiter[report]'.")
    rep.add_argument("cache", metavar="CACHE", help="a cache artifact (JSON)")
    rep.add_argument("histograms", nargs="*", metavar="REPORT",
                     help="dispatch histogram JSON files (--arbiter-histogram) or JUnit XML "
                     "reports (--junitxml: they also name the tests and the stale keys)")
    rep.add_argument("-o", "--output", required=True, metavar="HTML",
                     help="the page to write")
    rep.add_argument("--history", action="store_true",
                     help="instead: how each key's winner and median changed across the "
                     "git commits of CACHE (git log --follow; the working tree's file "
                     "last when it differs), winner changes and slowdowns marked")
    rep.add_argument("--max-commits", type=_positive_int, default=50, metavar="N",
                     help="with --history: the newest N commits (default: 50)")
    rep.set_defaults(run=commands["report"])

    exp = sub.add_parser(
        "export", help="write a cache's comparisons in another tool's format",
        description="Write the comparisons of a cache in pytest-benchmark's JSON format "
        "(--benchmark-json): one benchmark per key and candidate timed in the key's latest "
        "comparison, grouped by key, statistics in seconds (mean: the median; stddev: "
        "the interquartile range / 1.349). 'pytest-benchmark compare FILE' and "
        "github-action-benchmark (tool: pytest) read it.")
    exp.add_argument("cache", metavar="CACHE", help="a cache artifact (JSON)")
    exp.add_argument("--format", required=True, choices=("pytest-benchmark",),
                     help="the output format")
    exp.add_argument("-o", "--output", metavar="FILE",
                     help="the file to write (default: standard output)")
    exp.add_argument("--device", help="only entries of this device tag, or of this target "
                     "(cpu, nvidia, amd: all its devices)")
    exp.add_argument("--op", help="only entries of this op")
    exp.set_defaults(run=commands["export"])
