"""The report read a block at a time: the same page as the whole cache gives, and the
natural sort keys it orders entries by."""

from __future__ import annotations

import datetime
import random
import re
from pathlib import Path

import pytest

from pytest_arbiter.cli.report_cells import natural, natural_keys
from pytest_arbiter.store import artifacts
from tests.cli.test_report_page import entry


def test_natural_keys_sort_as_natural_does() -> None:
    """Digits, leading zeros, text after a number, the low control characters the
    keys' markers use, digits that are not ASCII: every pair compares as ``natural``."""
    rng = random.Random(7)
    alphabet = ["0", "1", "9", "x", "-", ",", "/", "\x00", "\x01", "\n", "\u0663", "m"]
    values = ["", "8x8", "08x8", "16x16", "m1-n1-k101", "m16-n64-k671", "a", "a1"]
    values += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
               for _ in range(300)]
    for batch in (values, [v for v in values if "\n" not in v and "\x00" not in v]):
        keys = natural_keys(batch)
        assert len(keys) == len(batch)
        for a, ka in zip(batch, keys, strict=True):
            for b, kb in zip(batch[:60], keys[:60], strict=True):
                assert (ka < kb) == (natural(a) < natural(b)), (a, b)
                assert (ka == kb) == (natural(a) == natural(b)), (a, b)


def test_natural_keys_of_long_numbers_stay_one_a_value() -> None:
    """A run of ten digits (a length written as a line break once split one value in
    two, and the report failed), of 48 (a length written as a digit), of thousands."""
    values = ["m1234567890", "m999999999", "m" + "7" * 48, "m" + "7" * 47, "k0" * 3000,
              "m12345678901", "x" + "1" * 4000, "m1234567890"]
    for batch in (values, [*values, "\x00" + "2" * 10]):  # joined, and one at a time
        keys = natural_keys(batch)
        assert len(keys) == len(batch)
        assert [v for _, v in sorted(zip(keys, batch, strict=True))] == sorted(batch,
                                                                              key=natural)
        assert keys[0] == keys[7] and keys[0] != keys[5]


def test_a_file_read_in_blocks_gives_the_page_of_the_whole_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``render_file`` keeps only what the page shows: with tables cut at 3 rows and a
    heat map of 2 shapes, its page is byte for byte ``render``'s of the whole cache."""
    pytest.importorskip("matplotlib")
    from pytest_arbiter.cli import report, report_heatmap

    monkeypatch.setattr(report, "MAX_TABLE_ROWS", 3)
    monkeypatch.setattr(report, "MAX_ROWS_PLOTTED", 2)
    monkeypatch.setattr(report_heatmap, "MAX_ROWS_PLOTTED", 2)
    sizes = list(range(300, 0, -1))  # past the point where the first rows are pruned
    entries = [entry(device, f"{n}x64x64", ("wmma", 1000.0 + n), ("cublas", 1500.0),
                     confidence=0.9 if n % 3 else 0.999)
               for device in ("sm_90", "sm_120") for n in sizes]
    path = tmp_path / "c.json"
    artifacts.write_cache(path, artifacts.MeasureCache(entries))
    now = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)
    whole = report.render(artifacts.read_cache(path), corpus=str(path), now=now)
    page, count = report.render_file(path, corpus=str(path), now=now)
    assert count == len(entries)
    assert page == whole
    assert "first 2 of 300 shapes" in page and "first 3 of 300 entries" in page
    rows = page.split('<tr id="e-')[1:4]
    assert [row.split("</td>")[0].rsplit(">", 1)[-1] for row in rows] == [
        "1x64x64", "2x64x64", "3x64x64"]


def test_a_heat_map_of_few_shapes_draws_every_cell_past_the_table_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A device and op with fewer shapes than the heat map draws but more entries than a
    table lists (60 shapes x 2 dtypes, tables cut at 100 rows): every one of the 120
    cells is drawn, none dropped with the table's cut."""
    pytest.importorskip("matplotlib")
    from pytest_arbiter.cli import report
    from tests.factories import ranked_entry

    monkeypatch.setattr(report, "MAX_TABLE_ROWS", 100)
    entries = [ranked_entry(f"m{b}", "a", "b", dtype=f"dt{d:02d}")
               for b in range(60) for d in range(2)]
    now = datetime.datetime(2026, 1, 2, tzinfo=datetime.timezone.utc)
    page = report.render(artifacts.MeasureCache(entries), now=now)
    heat = page[page.index('<figure class="heatmap">'):page.index("</figure>")]
    assert len(set(re.findall(r'id="g-\d+-cell-\d+"', heat))) == len(entries)
