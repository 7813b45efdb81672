"""Dispatch counts from the fleet's reports: JUnit XML files and histogram JSON files.

The plugin records each test's dispatches as testcase properties named
``arbiter:TARGET/OP/SELECTED/OUTCOME`` with the count as the value, next to each
failing one ``arbiter-reason:TARGET/OP/SELECTED/OUTCOME`` = why it happened (the
reason the run's summary gives: for people, never read back by a decision), and the
run's totals as properties of the ``<testsuite>`` (:func:`suite_properties`):

- ``arbiter-report`` = ``1``: pytest-arbiter was active in the run (and this is the
  version of the scheme);
- ``arbiter-total:TARGET/OP/SELECTED/OUTCOME`` = every dispatch of the run with that
  key, in tests, in xdist workers and outside any test;
- ``arbiter-outside:TARGET/OP/SELECTED/OUTCOME`` = the part of that total no testcase
  records (a dispatch at import or collection time, in a session hook);
- ``arbiter-incomplete`` = why the run's counts are incomplete (a crashed worker, an
  interrupted session), when they are.

This module reads them back with :mod:`junitparser` and fails closed: a suite whose
testcase counts plus its ``arbiter-outside`` counts are not its ``arbiter-total``
counts, key by key, is refused, and so are malformed or unknown ``arbiter`` properties,
``arbiter`` properties without the ``arbiter-report`` marker (an older pytest-arbiter's
report, or a damaged one), and an incomplete run's report. So a damaged report is an
error, never a degrade gone. The XML is parsed with no document type at all (a report
that declares one is refused: its entities could expand without bound or read local
files), whichever XML backend junitparser uses.

Test ids are normalised (the ``@group`` suffix ``pytest-xdist --dist loadgroup`` adds
is dropped) and kept sorted, so neither xdist nor test order changes what the gate
reports. This module never imports pytest.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import lt, sub
from typing import TYPE_CHECKING, Any

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating.histogram import (
    GATED_OUTCOMES,
    OUTCOMES,
    STALE,
    CountColumns,
    HistogramKey,
    positive,
)
from pytest_arbiter.gating.junit_xml import parse_xml

if TYPE_CHECKING:
    from pytest_arbiter.gating.baseline import Evidence
from pytest_arbiter.store.safetext import counted, escape

PROPERTY_PREFIX = "arbiter:"
"""Testcase property: ``arbiter:TARGET/OP/SELECTED/OUTCOME`` = what the test dispatched."""
REASON_PREFIX = "arbiter-reason:"
"""Testcase property: ``arbiter-reason:TARGET/OP/SELECTED/OUTCOME`` = why the test's
dispatches of that failing key happened (:func:`reason_text` of the run's reason). A
reader of ``arbiter:`` counts alone never sees it; an older gate refuses it by name."""
REASON_OUTCOMES: tuple[str, ...] = (*GATED_OUTCOMES, STALE)
"""The outcomes a reason is recorded for: those a gate can fail on."""
MAX_REASON_CHARS = 500
"""A recorded reason's length, escaped, at most: a traceback or a 10k-character message
is cut (the run's own summary has the whole of it)."""
EXPECT_DEGRADE_PROPERTY = "arbiter-expect-degrade"
TEST_PROPERTY = "arbiter-test"
"""Testcase property: the test's pytest node id (``tests/test_gemm.py::test_ragged[7]``),
written beside a gated entry's counts, so the gate names the test as pytest takes it."""
"""A testcase property saying the test degrades on purpose: its entries are not gated."""
REPORT_PROPERTY = "arbiter-report"
"""Suite property: pytest-arbiter was active; the value is :data:`REPORT_VERSION`."""
REPORT_VERSION = "1"
TOTAL_PREFIX = "arbiter-total:"
"""Suite property: every dispatch of the run with the key."""
OUTSIDE_PREFIX = "arbiter-outside:"
"""Suite property: the dispatches of the key that no testcase records."""
OUTSIDE_REASON_PREFIX = "arbiter-outside-reason:"
"""Suite property: the reason of a failing entry counted outside any test (a failing
kernel a measurement or a corpus replay found, a dispatch at collection time)."""
OUTSIDE_TESTS_PREFIX = "arbiter-outside-tests:"
"""Suite property: the node ids (a JSON array) of the tests during which a failing entry
counted outside any test was found (a kernel the tuning gate rejected in a test's
dispatch): what the gate names behind it."""
INCOMPLETE_PROPERTY = "arbiter-incomplete"
"""Suite property: why the run's counts are incomplete; the gate refuses such a report."""
CHECKED_PREFIX = "arbiter-checked:"
"""Suite property ``arbiter-checked:TARGET/OP/CANDIDATE`` = ``1``: the candidate passed
the F4 gate or ran a dispatch in the run, and never failed (what proves a baseline entry
of it fixed)."""
REGISTERED_PREFIX = "arbiter-registered:"
"""Suite property ``arbiter-registered:TARGET/OP/CANDIDATE`` = ``1``: the candidate was
registered for an op the run dispatched (a baseline entry of one that is not is gone);
the candidate ``-`` marks an op dispatched with none registered."""
STALE_PREFIX = "arbiter-stale:"
"""Suite property ``arbiter-stale:N`` = ``TARGET/OP/BUCKET/DTYPE: stale: ...``:
a key whose cached winner a recheck (``--arbiter-recheck``) found slower than another
candidate, timed side by side in the run."""

_OURS = ("arbiter:", "arbiter-")
_XDIST_GROUP = re.compile(r"@[^\[\]@]*$")
_COUNT = re.compile(r"[1-9][0-9]{0,17}")


@dataclass
class FleetCounts:
    """Dispatch counts of one or more reports, the tests behind each key, the sources."""

    counts: dict[HistogramKey, int] | CountColumns = field(default_factory=dict)
    """A dict, or one histogram file's counts as read: columns (no key made of each)."""
    tests: dict[HistogramKey, set[str]] = field(default_factory=dict)
    expected: dict[HistogramKey, int] | CountColumns = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    testcases: int = 0
    stale: list[tuple[str, str]] = field(default_factory=list)
    """(source, line) of each ``arbiter-stale:`` suite property read."""
    reasons: dict[HistogramKey, set[str]] = field(default_factory=dict)
    """The reasons JUnit reports record for each key (:func:`reason_text`: one escaped
    line, capped); a histogram file records none."""
    silent: list[str] = field(default_factory=list)
    """The reports (or their test suites) that carry no pytest-arbiter data: the plugin
    was off in that run, or the report was edited. A fleet gate fails closed on them."""
    checked: set[tuple[str, str, str]] = field(default_factory=set)
    registered: set[tuple[str, str, str]] = field(default_factory=set)
    with_evidence: int = 0
    """How many of the reports say what they saw of their candidates (JUnit reports of
    runs that dispatched)."""
    repeated: list[str] = field(default_factory=list)
    """Inputs named again (the same file): read once."""

    def evidence(self) -> Evidence | None:
        """What the reports saw of their candidates (None when none says: a fleet of
        histogram files only, judged by the older rule). A baseline entry no report
        proves fixed is unchecked, and kept."""
        from pytest_arbiter.gating.baseline import Evidence

        if not self.with_evidence:
            return None
        return Evidence.of(self.checked, (), self.registered)

    def add(self, key: HistogramKey, count: int, test: str | None = None) -> None:
        counts = self._counts()
        counts[key] = counts.get(key, 0) + count
        if test is not None:
            self.tests.setdefault(key, set()).add(test)

    def _counts(self) -> dict[HistogramKey, int]:
        """``counts`` as a dict, to add to."""
        if isinstance(self.counts, CountColumns):
            self.counts = self.counts.to_dict()
        return self.counts

    def _expected(self) -> dict[HistogramKey, int]:
        if isinstance(self.expected, CountColumns):
            self.expected = self.expected.to_dict()
        return self.expected

    def extend(self, other: FleetCounts) -> None:
        if not self.counts and not self.expected and isinstance(other.counts, CountColumns):
            # the first report, one histogram file: its columns, held as they are
            self.counts, self.expected = other.counts, other.expected
        elif self.counts:
            counts = self._counts()
            for key, count in other.counts.items():
                counts[key] = counts.get(key, 0) + count
        else:  # the first report: copied in C, not summed key by key
            self._counts().update(other.counts.items())
        for key, tests in other.tests.items():
            self.tests.setdefault(key, set()).update(tests)
        for key, why in other.reasons.items():
            self.reasons.setdefault(key, set()).update(why)
        if other.expected is not self.expected:
            expected = self._expected()
            for key, count in other.expected.items():
                expected[key] = expected.get(key, 0) + count
        self.sources.extend(other.sources)
        self.testcases += other.testcases
        self.stale.extend(other.stale)
        self.silent.extend(other.silent)
        self.checked |= other.checked
        self.registered |= other.registered
        self.with_evidence += other.with_evidence

    def gated(self) -> dict[HistogramKey, int] | CountColumns:
        """Counts minus those of tests that degrade on purpose (the keys with some left)."""
        counts = self.counts
        if isinstance(counts, CountColumns):
            return _gated_columns(counts, CountColumns.of(self.expected))
        if not self.expected and min(counts.values(), default=1) > 0:
            return dict(counts)  # nothing to take off: a copy, not a rebuild
        left = list(map(sub, counts.values(), map(self.expected.get, counts, repeat(0))))
        keep = list(map(lt, repeat(0), left))  # C loops: a fleet's histogram has 1M keys
        return dict(zip(compress(counts, keep), compress(left, keep), strict=True))


def _gated_columns(counts: CountColumns, expected: CountColumns) -> CountColumns:
    """:meth:`FleetCounts.gated` of columns: the same C loops on the keys' strings."""
    if not expected:
        return positive(counts)
    taken = dict(zip(expected.joined, expected.counts, strict=True))
    left = list(map(sub, counts.counts, map(taken.get, counts.joined, repeat(0))))
    return positive(counts.like(counts.joined, left))


def case_id(classname: str, name: str) -> str:
    """A stable id for a JUnit testcase: ``classname::name``, xdist's ``@group`` dropped."""
    base = _XDIST_GROUP.sub("", name)
    return f"{classname}::{base}" if classname else base


def property_name(key: HistogramKey, prefix: str = PROPERTY_PREFIX) -> str:
    """``arbiter:TARGET/OP/SELECTED/OUTCOME`` (or another prefix) for ``key``."""
    return prefix + "/".join(key)


def parse_property(name: str, prefix: str = PROPERTY_PREFIX) -> HistogramKey | None:
    """``arbiter:T/O/S/OUTCOME`` as a key; None for other properties; ValueError if bad.

    A candidate name may hold ``/``: target and op are the first two parts, the outcome
    the last, the candidate what is between.
    """
    if not name.startswith(prefix):
        return None
    parts = name[len(prefix):].split("/")
    if len(parts) < 4 or not all(parts):
        raise ValueError(f"property {name!r} is not {prefix}TARGET/OP/SELECTED/OUTCOME")
    target, op, outcome = parts[0], parts[1], parts[-1]
    selected = "/".join(parts[2:-1])
    if outcome not in OUTCOMES:
        raise ValueError(f"property {name!r} has unknown outcome {outcome!r}")
    return HistogramKey(target, op, selected, outcome)


def reason_text(reason: object) -> str:
    """``reason`` as a report records and prints it: one line, every non-printable
    character escaped (:func:`pytest_arbiter.store.safetext.escape`), cut to
    :data:`MAX_REASON_CHARS` with how much was left out. Idempotent."""
    text = escape(reason)
    if len(text) <= MAX_REASON_CHARS:
        return text
    kept = MAX_REASON_CHARS - 40  # room for the note, whatever its number
    return f"{text[:kept]}... ({len(text) - kept} more characters)"


def parse_count(name: str, value: str | None) -> int:
    """A property's count: a positive decimal integer as the plugin writes it (``3``, not
    ``03``, ``+3``, `` 3`` or ``3.0``); ValueError otherwise."""
    if value is None or _COUNT.fullmatch(value) is None:
        raise ValueError(f"property {name!r} has the value {value!r}, not a positive count")
    return int(value)


# -- writing: what the plugin puts in the report ------------------------------------------


def add_recorded(recorded: dict[HistogramKey, int],
                 user_properties: Iterable[Sequence[object]]) -> None:
    """Add the ``arbiter:`` counts of one test report's properties to ``recorded``: what
    the report's testcases will hold."""
    for prop in user_properties:
        name, value = prop[0], prop[1]
        if not isinstance(name, str) or not name.startswith(PROPERTY_PREFIX):
            continue
        try:
            key = parse_property(name)
            count = int(str(value))
        except ValueError:
            continue  # not ours after all; the gate will say what is wrong with it
        if key is not None:
            recorded[key] = recorded.get(key, 0) + count


def suite_properties(totals: Mapping[HistogramKey, int],
                     recorded: Mapping[HistogramKey, int],
                     incomplete: Sequence[str] = (),
                     stale: Sequence[str] = (),
                     evidence: Evidence | None = None,
                     reasons: Mapping[HistogramKey, str] | None = None,
                     tests: Mapping[HistogramKey, Iterable[str]] | None = None
                     ) -> list[tuple[str, str]]:
    """The suite properties of a run with these dispatch ``totals`` whose testcases
    record ``recorded``: the marker, the totals, the dispatches outside any test (with
    the run's reason of each failing one: ``reasons``, and the tests it was found
    in: ``tests``), why the counts are incomplete
    if they are, the stale keys a recheck found, and what the run saw of its candidates
    (``evidence``)."""
    props = [(REPORT_PROPERTY, REPORT_VERSION)]
    if evidence is not None:
        props.extend((f"{CHECKED_PREFIX}{t}/{o}/{c}", "1")
                     for t, o, c in sorted(evidence.checked))
        props.extend((f"{REGISTERED_PREFIX}{t}/{o}/{c or '-'}", "1")
                     for t, o, c in sorted(evidence.registered))
    if incomplete:
        props.append((INCOMPLETE_PROPERTY, "; ".join(incomplete)))
    live = sorted((k, v) for k, v in totals.items() if v > 0)
    props.extend((property_name(k, TOTAL_PREFIX), str(v)) for k, v in live)
    for key, count in live:
        outside = count - recorded.get(key, 0)
        if outside > 0:
            props.append((property_name(key, OUTSIDE_PREFIX), str(outside)))
            why = (reasons or {}).get(key, "")
            if key.outcome in REASON_OUTCOMES and why.strip():
                props.append((property_name(key, OUTSIDE_REASON_PREFIX), reason_text(why)))
            named = sorted(set((tests or {}).get(key, ())))
            if key.outcome in REASON_OUTCOMES and named:
                props.append((property_name(key, OUTSIDE_TESTS_PREFIX), json.dumps(named)))
    props.extend((f"{STALE_PREFIX}{number}", line) for number, line in enumerate(stale))
    return props


# -- reading ----------------------------------------------------------------------------


@dataclass
class _Suite:
    """One ``<testsuite>``'s arbiter data, as read."""

    marker: str | None = None
    incomplete: str | None = None
    totals: dict[HistogramKey, int] = field(default_factory=dict)
    outside: dict[HistogramKey, int] = field(default_factory=dict)
    in_cases: dict[HistogramKey, int] = field(default_factory=dict)
    tests: dict[HistogramKey, set[str]] = field(default_factory=dict)
    expected: dict[HistogramKey, int] = field(default_factory=dict)
    arbiter_data: bool = False
    stale: list[str] = field(default_factory=list)
    checked: set[tuple[str, str, str]] = field(default_factory=set)
    registered: set[tuple[str, str, str]] = field(default_factory=set)
    reasons: dict[HistogramKey, set[str]] = field(default_factory=dict)
    orphans: list[str] = field(default_factory=list)
    """Why a testcase's reason property is not the plugin's (a reason without a count)."""
    outside_reasons: set[HistogramKey] = field(default_factory=set)
    """The keys an ``arbiter-outside-reason:`` property gives a reason of."""
    outside_tests: dict[HistogramKey, set[str]] = field(default_factory=dict)
    """The tests an ``arbiter-outside-tests:`` property names behind a key."""
    cases: dict[str, _Case] = field(default_factory=dict)


@dataclass
class _Case:
    """One testcase's arbiter data, as read: its counts, its reasons, whether it
    degrades on purpose."""

    found: dict[HistogramKey, int] = field(default_factory=dict)
    reasons: dict[HistogramKey, str] = field(default_factory=dict)
    expected: bool = False
    nodeid: str = ""
    """The test's pytest node id (:data:`TEST_PROPERTY`), empty when not written."""


def _properties(element: Any, where: str) -> list[tuple[str, str]]:
    """(name, value) of the ``<property>`` elements of ``element``'s ``<properties>``."""
    from junitparser import Properties

    out = []
    for props in element.iterchildren(Properties):
        for prop in props:
            name, value = prop.name, prop.value
            if name is None or value is None:
                raise ValueError(f"{where}: a <property> without a "
                                 f"{'name' if name is None else 'value'}")
            out.append((name, value))
    return out


def _read_suite_properties(suite: Any, where: str, into: _Suite) -> None:
    seen: set[str] = set()
    for name, value in _properties(suite, where):
        if not name.startswith(_OURS):
            continue
        into.arbiter_data = True
        try:
            if name in seen:
                raise ValueError(f"the suite property {name!r} appears twice")
            seen.add(name)
            if name == REPORT_PROPERTY:
                into.marker = value
            elif name == INCOMPLETE_PROPERTY:
                into.incomplete = value
            elif name.startswith(STALE_PREFIX) and name[len(STALE_PREFIX):].isdecimal():
                into.stale.append(value)
            elif name.startswith((CHECKED_PREFIX, REGISTERED_PREFIX)):
                _read_evidence(name, value, into)
            elif name.startswith(OUTSIDE_TESTS_PREFIX):
                _read_outside_tests(name, value, into)
            elif name.startswith(OUTSIDE_REASON_PREFIX):
                key = parse_property(name, OUTSIDE_REASON_PREFIX)
                if key is None or key.outcome not in REASON_OUTCOMES or not value.strip():
                    raise ValueError(f"property {name!r} is not a reason of a failing entry")
                into.reasons.setdefault(key, set()).add(reason_text(value))
                into.outside_reasons.add(key)
            else:
                for prefix, counts in ((TOTAL_PREFIX, into.totals),
                                       (OUTSIDE_PREFIX, into.outside)):
                    key = parse_property(name, prefix)
                    if key is not None:
                        counts[key] = parse_count(name, value)
                        break
                else:
                    raise ValueError(f"unknown suite property {name!r}")
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


def _read_outside_tests(name: str, value: str, into: _Suite) -> None:
    key = parse_property(name, OUTSIDE_TESTS_PREFIX)
    try:
        named = json.loads(value)
    except ValueError:
        named = None
    if (key is None or key.outcome not in REASON_OUTCOMES or not isinstance(named, list)
            or not named or not all(isinstance(n, str) and n for n in named)):
        raise ValueError(f"property {name!r} is not a JSON array of the test ids behind "
                         "a failing entry")
    into.outside_tests[key] = {case_id("", n) for n in named}


def _read_evidence(name: str, value: str, into: _Suite) -> None:
    prefix = CHECKED_PREFIX if name.startswith(CHECKED_PREFIX) else REGISTERED_PREFIX
    parts = name[len(prefix):].split("/")
    if len(parts) < 3 or not all(parts) or value != "1":
        raise ValueError(f"property {name!r} is not {prefix}TARGET/OP/CANDIDATE = 1")
    triple = (parts[0], parts[1], "/".join(parts[2:]))
    if prefix == CHECKED_PREFIX:
        into.checked.add(triple)
    else:
        into.registered.add(triple if triple[2] != "-" else (*triple[:2], ""))


def _read_case(case: Any, where: str, into: _Suite) -> None:
    tid = case_id(case.classname or "", case.name or "")
    read = _Case()
    for name, value in _properties(case, f"{where}: test {tid}"):
        if not name.startswith(_OURS):
            continue
        into.arbiter_data = True
        try:
            if name == EXPECT_DEGRADE_PROPERTY:
                if value != "1":
                    raise ValueError(f"property {name!r} has the value {value!r}, not '1'")
                read.expected = True
            elif name == TEST_PROPERTY:
                if not value.strip() or read.nodeid:
                    raise ValueError(f"property {name!r} is empty or given twice")
                read.nodeid = case_id("", value)
            elif name.startswith(REASON_PREFIX):
                _read_reason(name, value, read)
            else:
                key = parse_property(name)
                if key is None:
                    raise ValueError(f"unknown testcase property {name!r}")
                read.found[key] = read.found.get(key, 0) + parse_count(name, value)
        except ValueError as exc:
            raise ValueError(f"{where}: test {tid}: {exc}") from None
    # said once the counts are checked: a count edited away is what such a report shows
    into.orphans.extend(f"{where}: test {tid}: property "
                        f"{property_name(key, REASON_PREFIX)!r} gives the reason for a "
                        "key the test records no dispatch of"
                        for key in read.reasons if key not in read.found)
    # a test written more than once (each attempt of a retried test) counts its last
    into.cases[tid] = read


def _read_reason(name: str, value: str, into: _Case) -> None:
    """An ``arbiter-reason:`` property: a failing key, once, with some text."""
    key = parse_property(name, REASON_PREFIX)
    if key is None or key.outcome not in REASON_OUTCOMES:
        raise ValueError(f"property {name!r}: a reason is recorded only for "
                         f"{', '.join(REASON_OUTCOMES)} entries")
    if key in into.reasons:
        raise ValueError(f"property {name!r} appears twice")
    if not value.strip():
        raise ValueError(f"property {name!r} has an empty reason")
    into.reasons[key] = reason_text(value)


def _tally(into: _Suite) -> None:
    """The suite's testcase counts and reasons: each test's last record."""
    for tid, case in into.cases.items():
        for key, count in case.found.items():
            into.in_cases[key] = into.in_cases.get(key, 0) + count
            if case.expected:  # its entries do not count against the gate: never named
                into.expected[key] = into.expected.get(key, 0) + count
            else:
                into.tests.setdefault(key, set()).add(case.nodeid or tid)
        for key, why in case.reasons.items():
            into.reasons.setdefault(key, set()).add(why)


def _check_suite(suite: _Suite, where: str) -> None:
    """The suite's totals account for every dispatch its testcases record, and no more."""
    if suite.marker is None:
        raise ValueError(f"{where}: has arbiter properties but no {REPORT_PROPERTY!r} "
                         "suite property: written by a pytest-arbiter older than this "
                         "one, or damaged; its counts cannot be checked")
    if suite.marker != REPORT_VERSION:
        raise ValueError(f"{where}: {REPORT_PROPERTY!r} is {suite.marker!r}: this "
                         f"pytest-arbiter reads version {REPORT_VERSION}")
    if suite.incomplete is not None:
        raise ValueError(f"{where}: the run's dispatch counts are incomplete "
                         f"({suite.incomplete}): rerun it")
    for key in sorted(set(suite.totals) | set(suite.outside) | set(suite.in_cases)):
        total = suite.totals.get(key, 0)
        cases, outside = suite.in_cases.get(key, 0), suite.outside.get(key, 0)
        if cases + outside != total:
            raise ValueError(
                f"{where}: {'/'.join(key)}: the testcases record "
                f"{counted(cases, 'dispatch', 'dispatches')} and "
                f"{outside} were outside any test, but the suite total is {total} "
                "(a damaged or edited report)")
    if suite.orphans:
        raise ValueError(suite.orphans[0])
    for key in sorted((suite.outside_reasons | set(suite.outside_tests))
                      - set(suite.outside)):
        raise ValueError(f"{where}: property {property_name(key, OUTSIDE_REASON_PREFIX)!r} "
                         "or the tests behind it are given for a key no dispatch outside "
                         "a test counted (a damaged or edited report)")


def junit_counts(data: bytes, source: str) -> FleetCounts:
    """The dispatch counts of the JUnit XML ``data``; ``ValueError`` naming ``source``
    if it is unreadable, damaged or inconsistent (see the module's docstring)."""
    from junitparser import JUnitXml, TestSuite

    root = parse_xml(data, source)
    try:
        xml = JUnitXml.fromroot(root)
    except Exception as exc:  # junitparser's JUnitXmlError: not a testsuite(s) root
        raise ValueError(f"{escape(source)} is not valid JUnit XML: {escape(exc)}") from None
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    out = FleetCounts(sources=[source])
    if not suites:
        out.silent.append(f"{escape(source)}: no testsuite")
    for number, element in enumerate(suites):
        where = f"{escape(source)}: testsuite {escape(repr(element.name or number))}"
        suite = _Suite()
        _read_suite_properties(element, where, suite)
        for case in element:
            out.testcases += 1
            _read_case(case, where, suite)
        _tally(suite)
        if not suite.arbiter_data:
            out.silent.append(where)  # the plugin was not active in this suite
            continue
        _check_suite(suite, where)
        for key, count in suite.totals.items():
            out.add(key, count)
        for key, tests in (*suite.tests.items(), *suite.outside_tests.items()):
            out.tests.setdefault(key, set()).update(tests)
        for key, why in suite.reasons.items():
            out.reasons.setdefault(key, set()).update(why)
        expected = out._expected()
        for key, count in suite.expected.items():
            expected[key] = expected.get(key, 0) + count
        out.stale.extend((source, line) for line in suite.stale)
        out.checked |= suite.checked
        out.registered |= suite.registered
    # a report proves fixes only when its suites say what they saw of their candidates
    out.with_evidence = int(bool(out.checked or out.registered))
    return out


def read_junit(path: str | os.PathLike[str]) -> FleetCounts:
    """The dispatch counts a JUnit XML report records; ``ArtifactError`` if unreadable,
    damaged or inconsistent."""
    from pytest_arbiter.store.artifacts import read_bytes

    try:
        return junit_counts(read_bytes(path), str(path))
    except ValueError as exc:
        raise ArtifactError(escape(exc)) from None


def read_report(path: str | os.PathLike[str]) -> FleetCounts:
    """A JUnit XML report or a histogram JSON file (by content), as counts."""
    from pytest_arbiter.gating import histogram_file
    from pytest_arbiter.store.artifacts import read_bytes
    from pytest_arbiter.store.strictjson import check_bom

    source = str(path)
    data = read_bytes(path)
    head = data[:256].lstrip()
    try:
        if head.startswith(b"<"):
            return junit_counts(data, source)
        if head.startswith(b"{"):
            out = FleetCounts(sources=[source])
            # columns: no key made of each of a million entries
            out.counts, out.expected = histogram_file.decode_columns(data, source)
            return out
        check_bom(data, source)
    except ValueError as exc:
        raise ArtifactError(escape(exc)) from None
    raise ArtifactError(f"{escape(source)} is neither JUnit XML nor a pytest-arbiter "
                        "histogram (it starts with neither '<' nor '{')")


def read_reports(paths: Iterable[str | os.PathLike[str]],
                 allow_no_data: Iterable[str | os.PathLike[str]] | None = None
                 ) -> FleetCounts:
    """Every report merged; the first unreadable one raises ``ArtifactError``. With
    ``allow_no_data`` (the fleet gate), a JUnit report that carries no pytest-arbiter
    data raises too, unless it is one of those paths: a runner whose plugin was off
    would otherwise pass the gate with its degrades unseen."""

    allowed = (None if allow_no_data is None
               else {os.path.realpath(p) for p in allow_no_data})
    total = FleetCounts()
    seen: set[str] = set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:  # a glob and a name of one file: its counts are added once
            total.repeated.append(str(path))
            continue
        seen.add(real)
        found = read_report(path)
        if allowed is not None and found.silent and os.path.realpath(path) not in allowed:
            raise ArtifactError(
                f"{found.silent[0]} carries no pytest-arbiter data (the plugin was off in "
                "that run, or the report was edited): its dispatches cannot be gated; if "
                f"that is expected, pass --allow-no-data {escape(str(path))}")
        total.extend(found)
    return total


def reasons_for(fleet: FleetCounts, key: HistogramKey) -> list[str]:
    """The distinct reasons the reports record for ``key``, sorted (the same whatever
    the order of the reports, the tests or the xdist workers)."""
    return sorted(fleet.reasons.get(key, ()))


def ids_for(fleet: FleetCounts, keys: Iterable[HistogramKey]
              ) -> Mapping[HistogramKey, list[str]]:
    """The sorted test ids behind each of ``keys``."""
    return {key: sorted(fleet.tests.get(key, ())) for key in keys}
