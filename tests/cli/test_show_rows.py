"""``show``'s cells built a column at a time for a block of entries are the cells of its
row-by-row rules: every latency's text, every cut, mark and escape."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_arbiter.cli.show_rows import (
    format_ns,
    narrow_columns,
    narrow_row,
    ns_cells,
    paired_only,
    row_columns,
)
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats
from tests.factories import cache_entry, ranked_entry, stats


def _around(x: float) -> list[float]:
    """Values at and next to ``x``: the floats either side, and whole ones."""
    near = [float(np.nextafter(x, -np.inf)), x, float(np.nextafter(x, np.inf))]
    whole = [int(x) + d for d in range(-3, 4) if int(x) + d >= 0]
    return [*near, *whole, x * (1 - 1e-12), x * (1 + 1e-12)]


def test_the_latencies_of_a_column_are_format_ns_of_each() -> None:
    """Random values of every magnitude, whole and not, and every value next to where
    the unit or the digits change (999.5 ns is 1.00 us; 99.95 us is 100 us)."""
    rng = random.Random(7)
    values: list[float] = []
    for digits in range(19):
        values += [rng.randrange(10**digits + 1) for _ in range(300)]
        values += [rng.random() * 10**digits for _ in range(300)]
    for scale in (1, 1e3, 1e6, 1e9):
        for at in (0.9995, 9.9949, 9.995, 9.9951, 10.0, 99.949, 99.95, 99.951, 100.0, 999.5):
            values += _around(at * scale)
    values += [0, 0.0, 2**53 - 1, 2**53, 2**53 + 1, 2**62, 1e-300, 5e-324]
    assert ns_cells(values) == list(map(format_ns, values))
    assert ns_cells([]) == []


def _faster_runner_up(bucket: str, *, tie: bool) -> CacheEntry:
    return ranked_entry(bucket, "wmma", "cublas", medians=(1000.0, 950.0), tie=tie)


def _carried(bucket: str) -> CacheEntry:
    return CacheEntry("sm_90", "nvidia", "matmul", bucket, "float16",
                      (RankedCandidate("wmma", stats(1000.0)),
                       RankedCandidate("cublas", stats(900.0), carried=True)))


def _block() -> list[CacheEntry]:
    """Entries of every kind of row: ties, low confidence, a carried runner-up, none,
    paired ratios, runners-up faster by the median, long names and keys."""
    long_name = "a_candidate_with_a_long_name_indeed"
    return [
        cache_entry("m1"), cache_entry("m2", runner_up=None),
        cache_entry("m3", tie=True, confidence=0.5), cache_entry("m4", confidence=0.6),
        cache_entry("m5", tie=True, confidence=0.4, samples=3),
        cache_entry("m6", median=999.6), cache_entry("m7", median=2.5e9),
        cache_entry("m8", winner=long_name, runner_up=long_name + "_too"),
        cache_entry("m9-" + "x" * 40, device="cpu-x86_64-a-very-long-device-tag-indeed"),
        ranked_entry("m10", "wmma", "cublas", medians=(1000.0, 950.0), ratios=(1.0, 1.031)),
        ranked_entry("m11", "wmma", "cublas", "tiled", medians=(1000.0, 10**7, 3.0)),
        ranked_entry("m12", "wmma", "cublas", op="a_long_op_name_for_a_user_op" * 2),
        _faster_runner_up("m13", tie=True), _carried("m14"),
        cache_entry("m15", confidence=0.0), cache_entry("m16", confidence=-0.0),
        cache_entry("m17", confidence=-0.0, tie=True), cache_entry("m18", confidence=0.0),
    ]


@pytest.mark.parametrize("paired", [False, True])
def test_a_blocks_columns_are_its_rows_cells(paired: bool) -> None:
    block = _block() + ([_faster_runner_up("m15", tie=False)] if paired else [])
    lows = [e.low_confidence for e in block]
    assert any(lows)
    for _ in range(2):  # the second time, the confidence cells made the first
        shown = narrow_columns(block, lows)
        assert shown.cells == row_columns(map(narrow_row, block, lows), 5)
    assert shown.paired is paired is any(map(paired_only, block))
    zeros = [cell for cell in shown.cells[4] if cell.lstrip("-").startswith("0.000")]
    assert {cell.startswith("-") for cell in zeros} == {True, False}
    assert any(len(cell) == 44 for cell in shown.cells[0])  # keys were cut


def test_a_block_with_a_name_to_escape_is_built_row_by_row() -> None:
    block = [*_block(), cache_entry("m16", winner="bad\x1b[31mname")]
    lows = [e.low_confidence for e in block]
    shown = narrow_columns(block, lows)
    assert shown.cells == row_columns(map(narrow_row, block, lows), 5)
    assert "bad\\x1b[31..." in shown.cells[1]
    assert narrow_columns([], []).cells == [[], [], [], [], []]


def test_diffs_lines_a_run_at_a_time_are_its_lines_one_by_one() -> None:
    """``diff``'s changed, added and removed lines built a column at a time: the old
    winner faster or slower now, not timed in NEW, a new pick low-confidence."""
    from pytest_arbiter.cli.main import _diff_line, _diff_run
    from pytest_arbiter.store.corpus import KeyChange, WinnerChange

    old = [ranked_entry(f"m{i}", "wmma", "cublas", medians=(1000.0 + i, 1500.0))
           for i in range(4)]
    new = [ranked_entry("m0", "cublas", "wmma", medians=(900.0, 1000.0), ratios=(1.0, 1.2)),
           ranked_entry("m1", "cublas", "wmma", medians=(999.0, 996.0), tie=True),
           ranked_entry("m2", "cublas", "tiled", medians=(2.5e9, 3e9), confidence=0.6),
           ranked_entry("m3", "cublas", medians=(5.0,))]
    changes = [WinnerChange(b.key, a, b) for a, b in zip(old, new, strict=True)]
    lines = _diff_run("changed", old, new)
    assert lines == list(map(_diff_line, changes))
    assert any("not timed in NEW" in line for line in lines)
    assert any("faster" in line for line in lines) and any("low-confidence" in line
                                                           for line in lines)
    # a tie's new winner is the higher tier, not a speed-up however its median moved
    assert lines[1].endswith("; new pick a tie (the higher tier, within 1% in NEW)")
    assert sum("a tie" in line for line in lines) == 1
    assert _diff_run("added", [], new) == [_diff_line(KeyChange(None, e)) for e in new]
    assert _diff_run("removed", old, []) == [_diff_line(KeyChange(e, None)) for e in old]


_LATENCIES = st.one_of(st.integers(0, 2**63 - 1), st.floats(0.0, 1e18),
                       st.integers(0, 10**4).map(lambda m: (m + 0.5) / 100),
                       st.sampled_from([0, 0.0, 999.5, 9.995e3, 99.95e6, 2**53 + 1]))


@st.composite
def _entries(draw: st.DrawFn) -> CacheEntry:
    """An entry of any shape ``show`` meets: one to four rows, a carried runner-up, a
    paired ratio or none, latencies of every size (and half way to a last digit), a
    winner's median of zero, confidences half way to a thousandth, long names."""
    count = draw(st.integers(1, 4))
    names = draw(st.lists(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=24),
                          min_size=count, max_size=count, unique=True))
    medians = sorted(draw(st.lists(_LATENCIES, min_size=count, max_size=count)))
    carried = count > 1 and draw(st.booleans())
    rows = []
    for place, (name, median) in enumerate(zip(names, medians, strict=True)):
        last = carried and place == count - 1
        ratio = None if last or place == 0 else draw(st.one_of(
            st.none(), st.floats(1e-6, 1e9), st.integers(0, 10**4).map(
                lambda m: 1 + (m + 0.5) / 1000)))
        latencies = LatencyStats(median, 0, 0, median, median or 1, 9)
        rows.append(RankedCandidate(name, latencies, carried=last, ratio=ratio))
    confidence = draw(st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, -0.0, 1.0]),
                                st.integers(0, 999).map(lambda m: (m + 0.5) / 1000)))
    device = draw(st.sampled_from(["sm_90", "cpu-x86_64-a-very-long-device-tag"]))
    return CacheEntry(device, "cpu", draw(st.sampled_from(["matmul", "op_" * 9])),
                      draw(st.text("mnk0123456789-", min_size=1, max_size=30)), "float32",
                      tuple(rows), confidence, draw(st.booleans()),
                      provenance={"rounds": draw(st.integers(1, 20))})


@settings(max_examples=150, deadline=None)
@given(st.lists(_entries(), max_size=12))
def test_generated_blocks_columns_are_their_rows_cells(block: list[CacheEntry]) -> None:
    lows = [e.low_confidence for e in block]
    shown = narrow_columns(block, lows)
    assert shown.cells == row_columns(map(narrow_row, block, lows), 5)
    assert shown.paired is any(map(paired_only, block))
