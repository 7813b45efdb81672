"""The degrade gate: a failing entry is new unless the baseline lists it, one the run
no longer shows is fixed, ``stale`` fails only when rechecks gate, and across a fleet an
entry no runner could check stays in the baseline."""

from __future__ import annotations

from pytest_arbiter.gating.baseline import compare_to_baseline, failing_outcomes, gate_fleet
from pytest_arbiter.gating.completeness import RunScope, baseline_to_write
from pytest_arbiter.gating.histogram import HistogramKey


def test_a_stale_baseline_entry_is_never_taken_for_fixed() -> None:
    """Its absence may only mean no recheck reached the key (no --arbiter-recheck, the
    budget spent): the gate's --update and --arbiter-write-baseline keep it."""
    stale = ("cpu", "matmul", "a", "stale")
    degraded = ("cpu", "matmul", "a", "degraded")
    baseline = {stale: 1, degraded: 2}
    run = {("cpu", "matmul", "a", "won"): 5}
    fleet = gate_fleet(run, baseline, failing=("degraded", "rejected", "error", "stale"))
    assert fleet.fixed == [degraded]
    assert fleet.unchecked == [stale]
    written, kept = baseline_to_write(run, baseline, RunScope())
    assert stale in written and degraded not in written
    assert kept == [stale]


def test_a_failing_entry_is_new_unless_the_baseline_lists_it() -> None:
    degraded = HistogramKey("cpu", "matmul", "k", "degraded")
    known = HistogramKey("cpu", "matmul", "j", "error")
    gone = HistogramKey("cpu", "softmax", "s", "rejected")
    run = {degraded: 2, known: 1, HistogramKey("cpu", "matmul", "blas", "won"): 9}
    verdict = compare_to_baseline(run, {known: 3, gone: 1})
    assert not verdict.passed
    assert verdict.new == {degraded: 2} and verdict.known == {known: 1}
    assert verdict.fixed == [gone]
    assert verdict.describe_new() == [
        "new degraded: target=cpu op=matmul candidate=k (2 dispatches)"]
    assert compare_to_baseline(run, {degraded: 1, known: 1}).passed


def test_stale_fails_only_when_rechecks_gate() -> None:
    assert "stale" not in failing_outcomes(stale=False)
    assert failing_outcomes(stale=True) == (*failing_outcomes(stale=False), "stale")
    stale = {HistogramKey("cpu", "matmul", "k", "stale"): 1}
    assert compare_to_baseline(stale, {}).passed
    assert not compare_to_baseline(stale, {}, failing=failing_outcomes(stale=True)).passed
