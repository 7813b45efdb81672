"""What a run covered, and so what it may write: a partial run keeps the baseline
entries it could not check, and an artifact path that cannot be written is named with
the reason before the run starts."""

from __future__ import annotations

from pathlib import Path

from pytest_arbiter.gating.completeness import RunScope, baseline_to_write, unwritable


def test_baseline_to_write_never_drops_what_a_partial_run_could_not_check() -> None:
    a, b = ("cpu", "op", "k", "degraded"), ("cpu", "op", "j", "error")
    gpu = ("nvidia", "op", "k", "degraded")
    run = {("cpu", "op", "k", "won"): 3, a: 1}
    full, kept = baseline_to_write(run, {a: 5, b: 1, gpu: 2}, RunScope())
    assert full == {("cpu", "op", "k", "won"): 3, a: 1, gpu: 2} and kept == [gpu]
    part, kept = baseline_to_write(run, {a: 5, b: 1, gpu: 2}, RunScope(partial=("-k",)))
    assert part == {("cpu", "op", "k", "won"): 3, a: 5, b: 1, gpu: 2} and kept == [b, gpu]


def test_unwritable_names_the_reason(tmp_path: Path) -> None:
    assert unwritable(tmp_path / "x.json") is None
    assert "does not exist" in str(unwritable(tmp_path / "no" / "x.json"))
    assert "is a folder" in str(unwritable(tmp_path))
