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


def test_a_written_histogram_needs_no_second_parse_and_a_key_twice_still_fails(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's files hold exactly the strings ``strings`` counts, so the reader
    spares the duplicate-key parse; a key given twice is one string more, so the parse
    runs and names it, as does any file the count cannot vouch for."""
    from pytest_arbiter.store import strictjson

    parsed: list[str] = []
    real = strictjson.check_unique_keys
    monkeypatch.setattr(strictjson, "check_unique_keys",
                        lambda data, source: (parsed.append(source), real(data, source)))
    counts = {("cpu", "matmul", "k", "degraded"): 3, ("cpu", "matmul", "blas", "won"): 5}
    path = tmp_path / "h.json"
    histogram_file.write_histogram(path, counts, {("cpu", "matmul", "k", "degraded"): 1})
    assert histogram_file.read_histogram(path) == counts and parsed == []
    text = path.read_text()
    for twice in (text.replace('"count": 5,', '"count": 5, "count": 5,'),
                  text.replace('"count": 5,', '"count": 5, "target": "cpu",'),
                  text.replace('"op": "matmul",', '"op": "matmul", "op": "x\\u0041",', 1)):
        path.write_text(twice)
        with pytest.raises(ArtifactError, match="appears twice in one object"):
            histogram_file.read_histogram(path)
    # a zero written out, an escape: counted no more, parsed again, read as they mean
    for other in (text.replace('"count": 5,', '"count": 5, "expected": 0,'),
                  text.replace('"op": "matmul"', '"op": "m\\u0061tmul"')):
        path.write_text(other)
        parsed.clear()
        assert histogram_file.read_histogram(path) == counts and parsed


DEEP = "[" * 3000 + "]" * 3000


@pytest.mark.parametrize("where", [
    histogram_text(DEGRADE, ', "extra": ' + DEEP),
    histogram_text(DEGRADE.replace('"count": 2', '"count": 2, "extra": ' + DEEP)),
    histogram_text(DEGRADE.replace('"count": 2', '"count": ' + DEEP)),
    histogram_text(DEGRADE.replace('"k"', DEEP)),
    histogram_text(DEGRADE, ', "total": {"count": 2, "expected": ' + DEEP + "}"),
    histogram_text(DEGRADE, ', "total": ' + DEEP),
    histogram_text(DEGRADE.replace('"k"', '"\\u006b"'), ', "extra": ' + DEEP),
], ids=["top-level-field", "entry-field", "count", "name", "total-field", "total",
        "with-an-escape"])
def test_a_deep_value_anywhere_in_a_histogram_is_refused_without_counting_depth(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    """The histogram's schema is closed (every struct refuses unknown fields, no value
    is free-form), so a value nested deeper than it allows fails the typed decode: the
    reader does not need the bytes' depth counted, and a 3000-deep value is refused
    wherever it stands, naming the file, on any Python."""
    from pytest_arbiter.store import strictjson

    def never(data: bytes, source: str, limit: int = 0) -> None:
        raise AssertionError("the depth was counted")

    monkeypatch.setattr(strictjson, "check_depth", never)
    counts = {("cpu", "m", "k", "degraded"): 2}
    histogram_file.write_histogram(tmp_path / "h.json", counts)
    assert histogram_file.read_histogram(tmp_path / "h.json") == counts
    path = tmp_path / "deep.json"
    path.write_text(where)
    with pytest.raises(ArtifactError) as raised:
        histogram_file.read_histogram(path)
    assert str(path) in str(raised.value)
