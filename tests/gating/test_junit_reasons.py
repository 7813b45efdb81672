"""The ``arbiter-reason:`` testcase properties of a JUnit report read back: escaped and
cut, the last attempt of a rerun only, and refused when they cannot be the plugin's."""

from __future__ import annotations

from html import escape
from pathlib import Path

import pytest

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating import junit
from pytest_arbiter.gating.histogram import HistogramKey
from tests.hostile import suite_xml

KEY = "cpu/m/k/degraded"
DEGRADED = HistogramKey("cpu", "m", "k", "degraded")


def case(name: str, *props: tuple[str, str]) -> str:
    inner = "".join(f'<property name="{k}" value="{v}"/>' for k, v in props)
    return f'<testcase classname="t" name="{name}"><properties>{inner}</properties></testcase>'


def report(tmp_path: Path, *cases: str, totals: dict[str, int] | None = None) -> Path:
    path = tmp_path / "report.xml"
    path.write_text(suite_xml("".join(cases), {KEY: len(cases)} if totals is None else totals))
    return path


def test_a_reason_reads_back_under_its_key(tmp_path: Path) -> None:
    path = report(tmp_path, case("a", (f"arbiter:{KEY}", "1"),
                                 (f"arbiter-reason:{KEY}", "declined: odd size")),
                  case("b", (f"arbiter:{KEY}", "1"),
                       (f"arbiter-reason:{KEY}", "declined: odd size")))
    assert junit.read_report(path).reasons == {DEGRADED: {"declined: odd size"}}


def test_a_rerun_gives_the_reason_of_its_last_attempt(tmp_path: Path) -> None:
    path = report(tmp_path, case("a", (f"arbiter:{KEY}", "1"),
                                 (f"arbiter-reason:{KEY}", "first attempt")),
                  case("a", (f"arbiter:{KEY}", "1"),
                       (f"arbiter-reason:{KEY}", "last attempt")), totals={KEY: 1})
    assert junit.read_report(path).reasons == {DEGRADED: {"last attempt"}}
    path = report(tmp_path, case("a", (f"arbiter:{KEY}", "1"),
                                 (f"arbiter-reason:{KEY}", "first attempt")),
                  case("a", (f"arbiter:{KEY}", "1")), totals={KEY: 1})
    assert junit.read_report(path).reasons == {}


def test_a_reason_is_one_escaped_line_of_bounded_length(tmp_path: Path) -> None:
    hostile = "a&#10;::error::pwned&#x9b;2J]]>" + "z" * 10_000
    path = report(tmp_path, case("a", (f"arbiter:{KEY}", "1"),
                                 (f"arbiter-reason:{KEY}", hostile)))
    (why,) = junit.read_report(path).reasons[DEGRADED]
    assert why.startswith("a\\n::error::pwned\\x9b2J]]>zzz") and why.isprintable()
    assert len(why) <= junit.MAX_REASON_CHARS and why.endswith(" more characters)")
    assert junit.reason_text(why) == why  # the plugin's text, read again, is the same


@pytest.mark.parametrize(("props", "needle"), [
    pytest.param(((f"arbiter-reason:{KEY}", "why"),), "records no dispatch of",
                 id="no-count"),
    pytest.param(((f"arbiter:{KEY}", "1"), ("arbiter-reason:cpu/m/k/won", "why")),
                 "a reason is recorded only for", id="won"),
    pytest.param(((f"arbiter:{KEY}", "1"), (f"arbiter-reason:{KEY}", " ")),
                 "empty reason", id="empty"),
    pytest.param(((f"arbiter:{KEY}", "1"), (f"arbiter-reason:{KEY}", "a"),
                  (f"arbiter-reason:{KEY}", "b")), "appears twice", id="twice"),
    pytest.param(((f"arbiter:{KEY}", "1"), ("arbiter-reason:cpu/m", "why")),
                 "TARGET/OP/SELECTED/OUTCOME", id="bad-key"),
])
def test_a_reason_the_plugin_cannot_have_written_is_refused(
        tmp_path: Path, props: tuple[tuple[str, str], ...], needle: str) -> None:
    totals = {KEY: 1} if any(name.startswith("arbiter:") for name, _ in props) else {}
    path = report(tmp_path, case("a", *props), totals=totals)
    with pytest.raises(ArtifactError, match=needle):
        junit.read_report(path)



def one_outside(extra: str, *, outside: bool = True) -> str:
    """A suite whose testcase dispatched KEY once, with one more dispatch of it outside
    any test (``outside``: else that count edited away) and the suite property
    ``extra`` beside it."""
    counts = f'<property name="arbiter-outside:{KEY}" value="1"/>' if outside else ""
    return suite_xml(case("a", (f"arbiter:{KEY}", "1")), {KEY: 1 + outside}).replace(
        "</properties>", f"{counts}{extra}</properties>", 1)


def test_an_outside_reason_without_an_outside_count_is_damage(tmp_path: Path) -> None:
    """The reason of a key counted outside any test, with that count edited away: the
    report is refused, as a testcase's reason without its count is."""
    reason = f'<property name="arbiter-outside-reason:{KEY}" value="raised ValueError"/>'
    path = tmp_path / "kept.xml"
    path.write_text(one_outside(reason))
    assert junit.read_report(path).reasons == {DEGRADED: {"raised ValueError"}}
    path.write_text(one_outside(reason, outside=False))
    with pytest.raises(ArtifactError, match="no dispatch outside a test counted"):
        junit.read_report(path)


@pytest.mark.parametrize("value", ['["t.py::test_x"]', "t.py::test_x", "[]", "[3]"])
def test_the_tests_behind_an_outside_entry_read_back_or_are_refused(
        tmp_path: Path, value: str) -> None:
    """``arbiter-outside-tests:KEY`` names the tests a finding counted outside any test
    was made in (a JSON array of node ids); anything else, or the property without the
    outside count, is a damaged report."""
    named = f'<property name="arbiter-outside-tests:{KEY}" value="{escape(value)}"/>'
    path = tmp_path / "r.xml"
    path.write_text(one_outside(named))
    if value != '["t.py::test_x"]':
        with pytest.raises(ArtifactError, match="not a JSON array of the test ids"):
            junit.read_report(path)
        return
    assert junit.read_report(path).tests[DEGRADED] == {"t::a", "t.py::test_x"}
    path.write_text(one_outside(named, outside=False))
    with pytest.raises(ArtifactError, match="no dispatch outside a test counted"):
        junit.read_report(path)
