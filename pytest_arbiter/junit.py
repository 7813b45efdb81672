"""Dispatch counts from the fleet's reports: JUnit XML files and histogram JSON files.

The plugin records each test's dispatches as JUnit properties named
``arbiter:TARGET/OP/SELECTED/OUTCOME`` with the count as the value. This module reads
them back with :mod:`junitparser`, together with the test that recorded each, so the
gate can name the tests behind a new degrade. Test ids are normalised (the ``@group``
suffix ``pytest-xdist --dist loadgroup`` adds is dropped) and kept sorted, so neither
xdist nor test order changes what the gate reports.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pytest_arbiter.artifacts import ArtifactError, read_histogram_expected
from pytest_arbiter.histogram import OUTCOMES, HistogramKey

PROPERTY_PREFIX = "arbiter:"
EXPECT_DEGRADE_PROPERTY = "arbiter-expect-degrade"
"""A testcase property saying the test degrades on purpose: its entries are not gated."""

_XDIST_GROUP = re.compile(r"@[^\[\]@]*$")


@dataclass
class FleetCounts:
    """Dispatch counts of one or more reports, the tests behind each key, the sources."""

    counts: dict[HistogramKey, int] = field(default_factory=dict)
    tests: dict[HistogramKey, set[str]] = field(default_factory=dict)
    expected: dict[HistogramKey, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    testcases: int = 0

    def add(self, key: HistogramKey, count: int, test: str | None = None) -> None:
        self.counts[key] = self.counts.get(key, 0) + count
        if test is not None:
            self.tests.setdefault(key, set()).add(test)

    def extend(self, other: FleetCounts) -> None:
        for key, count in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + count
        for key, tests in other.tests.items():
            self.tests.setdefault(key, set()).update(tests)
        for key, count in other.expected.items():
            self.expected[key] = self.expected.get(key, 0) + count
        self.sources.extend(other.sources)
        self.testcases += other.testcases

    def gated(self) -> dict[HistogramKey, int]:
        """Counts minus those of tests that degrade on purpose."""
        out = {}
        for key, count in self.counts.items():
            left = count - self.expected.get(key, 0)
            if left > 0:
                out[key] = left
        return out


def case_id(classname: str, name: str) -> str:
    """A stable id for a JUnit testcase: ``classname::name``, xdist's ``@group`` dropped."""
    base = _XDIST_GROUP.sub("", name)
    return f"{classname}::{base}" if classname else base


def parse_property(name: str) -> HistogramKey | None:
    """``arbiter:T/O/S/OUTCOME`` as a key; None for other properties; ValueError if bad."""
    if not name.startswith(PROPERTY_PREFIX):
        return None
    parts = name[len(PROPERTY_PREFIX):].split("/")
    if len(parts) < 4 or not all(parts):
        raise ValueError(f"property {name!r} is not arbiter:TARGET/OP/SELECTED/OUTCOME")
    target, op, outcome = parts[0], parts[1], parts[-1]
    selected = "/".join(parts[2:-1])
    if outcome not in OUTCOMES:
        raise ValueError(f"property {name!r} has unknown outcome {outcome!r}")
    return (target, op, selected, outcome)


def read_junit(path: str | os.PathLike[str]) -> FleetCounts:
    """The dispatch counts a JUnit XML report records; ``ArtifactError`` if unreadable."""
    from junitparser import JUnitXml, Properties, TestSuite

    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"cannot read {p}: no such file")
    try:
        xml = JUnitXml.fromfile(str(p))
    except Exception as exc:  # junitparser raises whatever its XML parser raises
        raise ArtifactError(f"{p} is not valid JUnit XML: {exc}") from None
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    out = FleetCounts(sources=[str(p)])
    for suite in suites:
        for case in suite:
            out.testcases += 1
            tid = case_id(case.classname or "", case.name or "")
            found: list[tuple[HistogramKey, int]] = []
            expected = False
            for props in case.iterchildren(Properties):
                for prop in props:
                    if prop.name == EXPECT_DEGRADE_PROPERTY:
                        expected = True
                        continue
                    try:
                        key = parse_property(prop.name or "")
                        if key is None:
                            continue
                        count = int(prop.value)
                    except (TypeError, ValueError) as exc:
                        raise ArtifactError(f"{p}: test {tid}: {exc}") from None
                    if count < 0:
                        raise ArtifactError(f"{p}: test {tid}: negative count for "
                                            f"{prop.name!r}")
                    found.append((key, count))
            for key, count in found:
                out.add(key, count, tid)
                if expected:
                    out.expected[key] = out.expected.get(key, 0) + count
    return out


def read_report(path: str | os.PathLike[str]) -> FleetCounts:
    """A JUnit XML report or a histogram JSON file (by content), as counts."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            head = f.read(256).lstrip()
    except OSError as exc:
        raise ArtifactError(f"cannot read {p}: {exc.strerror or exc}") from None
    if head.startswith(b"<"):
        return read_junit(p)
    if head.startswith(b"{"):
        out = FleetCounts(sources=[str(p)])
        counts, out.expected = read_histogram_expected(p)
        for key, count in counts.items():
            out.add(key, count)
        return out
    raise ArtifactError(f"{p} is neither JUnit XML nor a pytest-arbiter histogram "
                        "(it starts with neither '<' nor '{')")


def read_reports(paths: Iterable[str | os.PathLike[str]]) -> FleetCounts:
    """Every report merged; the first unreadable one raises ``ArtifactError``."""
    total = FleetCounts()
    for path in paths:
        total.extend(read_report(path))
    return total


def ids_for(fleet: FleetCounts, keys: Iterable[HistogramKey]
              ) -> Mapping[HistogramKey, list[str]]:
    """The sorted test ids behind each of ``keys``."""
    return {key: sorted(fleet.tests.get(key, ())) for key in keys}
