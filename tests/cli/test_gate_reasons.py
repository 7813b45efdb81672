"""``pytest-arbiter gate`` prints the reasons the JUnit reports record under each new
entry: distinct, sorted, at most :data:`MAX_REASONS_SHOWN`, escaped."""

from __future__ import annotations

from pathlib import Path

from pytest_arbiter.cli.main import MAX_REASONS_SHOWN
from tests.hostile import assert_safe_output, run_cli, suite_xml

KEY = "cpu/m/k/degraded"


def report(path: Path, reason: str) -> Path:
    path.write_text(suite_xml(
        '<testcase classname="t" name="a"><properties>'
        f'<property name="arbiter:{KEY}" value="1"/>'
        f'<property name="arbiter-reason:{KEY}" value="{reason}"/>'
        "</properties></testcase>", {KEY: 1}))
    return path


def test_distinct_reasons_are_listed_sorted_and_capped(tmp_path: Path) -> None:
    reports = [report(tmp_path / f"r{n}.xml", f"declined: reason {n % 5}") for n in range(7)]
    code, out, err = run_cli("gate", "--baseline", tmp_path / "b.json", *reversed(reports))
    assert code == 1, out + err
    lines = out.splitlines()
    at = lines.index("NEW degraded: target=cpu op=m candidate=k (7 dispatches) in t::a")
    assert lines[at + 1:at + 2 + MAX_REASONS_SHOWN] == [
        "  reason: declined: reason 0", "  reason: declined: reason 1",
        "  reason: declined: reason 2", "  (+2 more reasons)"]
    assert lines[at + 2 + MAX_REASONS_SHOWN].startswith("degrade gate FAILED")


def test_a_hostile_reason_is_escaped(tmp_path: Path) -> None:
    path = report(tmp_path / "r.xml", "&#10;::error file=ci.yml::pwned&#x9b;2J&#x2028;##[group]")
    code, out, err = run_cli("gate", "--baseline", tmp_path / "b.json", path)
    assert code == 1, out + err
    assert "  reason: \\n::error file=ci.yml::pwned\\x9b2J\\u2028##[group]\n" in out
    assert_safe_output(out + err)


def test_an_unchecked_entry_says_why_no_report_proved_it_fixed() -> None:
    """Not dispatched at all, dispatched without the candidate checked, or a stale entry
    no recheck saw: three reasons, each said as it is."""
    from pytest_arbiter.cli.main import _fixed_lines
    from pytest_arbiter.gating.baseline import BaselineVerdict, FleetVerdict
    from pytest_arbiter.gating.histogram import HistogramKey

    unchecked = [HistogramKey("nvidia", "matmul", "wmma", "degraded"),
                 HistogramKey("cpu", "mm", "fast", "degraded"),
                 HistogramKey("cpu", "mm", "fast", "stale")]
    fv = FleetVerdict(BaselineVerdict([], {}, []), unchecked)
    seen = {HistogramKey("cpu", "mm", "slow", "won"): 3}
    lines = list(_fixed_lines(fv, False, True, seen))
    assert lines == [  # in key order
        "unchecked degraded: target=cpu op=mm candidate=fast (no report checked fast "
        "(unavailable, or not reached): kept in the baseline)",
        "unchecked stale: target=cpu op=mm candidate=fast (no report rechecked it: kept in "
        "the baseline)",
        "unchecked degraded: target=nvidia op=matmul candidate=wmma (no report dispatched "
        "nvidia/matmul: kept in the baseline)"]
