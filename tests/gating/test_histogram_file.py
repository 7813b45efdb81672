"""The histogram file, which is also the baseline's format: deterministic bytes, the
outcome type, files no reader would accept are never written, and damaged ones are
refused naming the file and the place."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.gating import histogram_file
from pytest_arbiter.gating.histogram import OUTCOMES
from tests.hostile import DEGRADE, HOSTILE_JSON, histogram_text


def test_the_outcome_type_is_the_outcome_list() -> None:
    assert typing.get_args(histogram_file.Outcome) == OUTCOMES


def test_histogram_bytes_are_deterministic_and_the_format_kept(tmp_path: Path) -> None:
    counts = {("cpu", "matmul", "k", "degraded"): 3, ("cpu", "matmul", "blas", "won"): 5}
    path = tmp_path / "h.json"
    histogram_file.write_histogram(path, counts, {("cpu", "matmul", "k", "degraded"): 1})
    first = path.read_bytes()
    data = json.loads(first)
    assert list(data) == ["entries", "schema", "total", "version"]
    assert data["total"] == {"count": 8, "expected": 1}
    assert [list(e) for e in data["entries"]] == [
        ["count", "op", "outcome", "selected", "target"],
        ["count", "expected", "op", "outcome", "selected", "target"]]
    counts_read, expected = histogram_file.read_histogram_expected(path)
    histogram_file.write_histogram(path, counts_read, expected)
    assert path.read_bytes() == first
    # a baseline committed before the total existed (two-space indent, sorted keys)
    del data["total"]
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    assert histogram_file.read_histogram(path) == counts


def test_a_histogram_that_no_reader_would_accept_is_not_written(tmp_path: Path) -> None:
    for counts in ({("cpu", "", "k", "won"): 1}, {("cpu", "m", "k", "won"): -1},
                   {("cpu", "m", "k", "wonderful"): 1}, {("cpu", "m", "k\ud800", "won"): 1}):
        with pytest.raises(ArtifactError, match=r"cannot write .*h\.json"):
            histogram_file.write_histogram(tmp_path / "h.json", counts)
        assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize("name", sorted(HOSTILE_JSON))
def test_a_damaged_histogram_is_refused_naming_the_file_and_the_place(
        tmp_path: Path, name: str) -> None:
    data, needle = HOSTILE_JSON[name]
    path = tmp_path / f"{name}.json"
    path.write_bytes(data)
    with pytest.raises(ArtifactError) as raised:
        histogram_file.read_histogram(path)
    assert str(path) in str(raised.value) and needle in str(raised.value)


def test_the_expected_counts_read_back_beside_the_counts(tmp_path: Path) -> None:
    path = tmp_path / "h.json"
    path.write_text(histogram_text(DEGRADE.replace("}", ', "expected": 1}')))
    counts, expected = histogram_file.read_histogram_expected(path)
    assert counts == {("cpu", "m", "k", "degraded"): 2}
    assert expected == {("cpu", "m", "k", "degraded"): 1}
