"""The cache artifact and the fleet corpus: format, atomicity, locking, the merge rule."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pytest_arbiter import artifacts
from pytest_arbiter.arbiter import measured_arbitrate
from pytest_arbiter.cache import (
    CACHE_VERSION,
    ENTRY_FIELDS,
    RANKING_FIELDS,
    CacheEntry,
    MeasureCache,
    RankedCandidate,
    _candidate,
    _load_fast,
    _parse_entry,
    _parse_row,
    _rows_valid,
    cache_document,
    evidence,
    stable_float,
)
from pytest_arbiter.candidates import CandidateRegistry
from pytest_arbiter.corpus import diff, merge, prefer
from pytest_arbiter.device import cpu_device
from pytest_arbiter.measure import ComparePolicy, LatencyStats

FAST = ComparePolicy(warmup=1, min_rounds=3, max_rounds=5, budget_s=0.001)


def stats(median: float, samples: int = 25, spread: float = 0.1) -> LatencyStats:
    half = median * spread / 2
    return LatencyStats(median, median - 2 * half, median - half, median + half,
                        median + 3 * half, samples)


def entry(bucket: str = "m32-n16-k32", winner: str = "a", *, device: str = "dev0",
          confidence: float = 0.999, samples: int = 25, spread: float = 0.1,
          tie: bool = False, host: str = "h1", runner_up: str | None = "b") -> CacheEntry:
    ranking = [RankedCandidate(winner, stats(1000.0, samples, spread))]
    if runner_up is not None:
        ranking.append(RankedCandidate(runner_up, stats(1500.0, samples, spread)))
    prov = {"host": host, "device_name": "Test Device", "measured_at": "2026-12-03T06:00:00Z",
            "versions": {"pytest-arbiter": "0.1.0"}, "rounds": samples, "timed_ns": 12345,
            "shapes": [[32, 32], [32, 16]]}
    return CacheEntry(device, "cpu", "matmul", bucket, "float32", tuple(ranking), confidence,
                      tie, {"slow": "failed the F4 gate: too far"}, prov)


def write(path: Path, *entries: CacheEntry) -> bytes:
    artifacts.write_cache(path, MeasureCache(entries))
    return path.read_bytes()


# -- the format ---------------------------------------------------------------------------


def test_write_read_write_is_byte_identical(tmp_path: Path, registry: CandidateRegistry
                                           ) -> None:
    cache = MeasureCache([entry("b1"), entry("b2", "b", host="h2", confidence=0.5)])
    a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    measured_arbitrate("matmul", (a, a), registry.for_op("matmul"), cache, policy=FAST)
    first = tmp_path / "c.json"
    artifacts.write_cache(first, cache)
    text = first.read_bytes()
    assert text.endswith(b"}\n") and b"NaN" not in text
    again = tmp_path / "again.json"
    artifacts.write_cache(again, artifacts.read_cache(first))
    assert again.read_bytes() == text
    # and the entries survive (latencies in whole nanoseconds)
    loaded = artifacts.read_cache(first)
    assert len(loaded) == 3
    measured = next(e for e in loaded.entries() if e.device == cpu_device().tag)
    assert measured.provenance["device_name"] == cpu_device().name
    assert measured.samples >= 1 and measured.spread >= 0


F = {name: i for i, name in enumerate(ENTRY_FIELDS)}
"""Position of each field in an on-disk entry array."""


def test_document_is_sorted_and_shares_run_provenance() -> None:
    doc = cache_document([entry("z"), entry("a"), entry("m", host="h2")])
    assert [e[F["bucket"]] for e in doc["entries"]] == ["a", "m", "z"]
    assert [r["host"] for r in doc["runs"]] == ["h1", "h2"]
    assert {e[F["provenance"]]["run"] for e in doc["entries"]} == {0, 1}
    assert "host" not in doc["entries"][0][F["provenance"]]
    assert doc["entry_fields"] == ["device", "target", "op", "bucket", "dtype", "confidence",
                                   "tie", "ranking", "rejected", "provenance"]
    assert doc["ranking_fields"] == ["name", "median_ns", "min_ns", "q1_ns", "q3_ns",
                                     "max_ns", "samples"]
    # an entry is an array in that order, a ranking row one string, latencies in whole ns
    assert doc["entries"][0] == ["dev0", "cpu", "matmul", "a", "float32", 0.999, False,
                                 ["a 1000 900 950 1050 1150 25", "b 1500 1350 1425 1575 1725 25"],
                                 {"slow": "failed the F4 gate: too far"},
                                 {"rounds": 25, "run": 0, "shapes": [[32, 32], [32, 16]],
                                  "timed_ns": 12345}]


def test_latencies_are_written_in_whole_nanoseconds(tmp_path: Path) -> None:
    fractional = CacheEntry("dev0", "cpu", "matmul", "f", "float32", (
        RankedCandidate("k", LatencyStats(1181.75, 0.4, 1100.5, 1250.5, 2e12 + 0.25, 3)),))
    path = tmp_path / "c.json"
    text = write(path, fractional)
    assert b'"k 1182 0 1100 1250 2000000000000 3"' in text  # round half to even
    stats_back = artifacts.read_cache(path).entries()[0].ranking[0].stats
    assert stats_back == LatencyStats(1182.0, 0.0, 1100.0, 1250.0, 2e12, 3)
    assert write(tmp_path / "again.json", *artifacts.read_cache(path).entries()) == text


def test_the_documented_example_reads_and_writes_back_byte_identical(tmp_path: Path) -> None:
    doc = Path(__file__).parents[1] / "docs" / "artifacts.md"
    example = doc.read_text().split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.json"
    path.write_text(example)
    cache = artifacts.read_cache(path)
    assert [e.winner for e in cache.entries()] == ["dot_matmul", "inplace_softmax"]
    assert write(tmp_path / "again.json", *cache.entries()).decode() == example


def test_stable_float_is_idempotent() -> None:
    for value in (0.0, -0.0, 1.0, 123456.789, 1e-9, 2.5e12, 1 / 3):
        once = stable_float(value)
        assert stable_float(once) == once and repr(stable_float(once)) == repr(once)
    assert repr(stable_float(-0.0)) == "0.0"


def test_newer_schema_version_is_refused_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    data = json.loads(write(path, entry()))
    data["version"] = CACHE_VERSION + 1
    path.write_text(json.dumps(data))
    with pytest.raises(artifacts.ArtifactError,
                       match=rf"c.json: cache schema version {CACHE_VERSION + 1} is newer "
                             rf"than version {CACHE_VERSION}"):
        artifacts.read_cache(path)


def _set_row(index: int, row: object) -> Callable[[list[Any]], None]:
    def mutate(e: list[Any]) -> None:
        e[F["ranking"]][index] = row
    return mutate


def _set(name: str, value: object) -> Callable[[list[Any]], None]:
    def mutate(e: list[Any]) -> None:
        e[F[name]] = value
    return mutate


@pytest.mark.parametrize(("mutate", "message"), [
    (_set_row(0, "a 1000 900 950 1050 1150"),
     r"entries\[0\].*a ranking row must be a string 'name median_ns min_ns q1_ns q3_ns "
     r"max_ns samples' or an array of those 7 values, got 'a 1000 900 950 1050 1150'"),
    (_set_row(0, "a fast 900 950 1050 1150 25"), r"a: median_ns must be a number, got 'fast'"),
    (_set_row(0, " 1000 900 950 1050 1150 25"), r"candidate name must be a non-empty"),
    (_set_row(0, "a 1000 900 950 1050 1150 0"), r"a: samples must be a positive integer, got 0"),
    (_set_row(0, "a 1000 900 950 1050 1150 x"), r"samples must be a positive integer, got 'x'"),
    (_set_row(0, "a 1000 900 950 1050 1150 2.5"), r"samples must be a positive integer"),
    (_set_row(0, "a 1000 -1 950 1050 1150 25"), r"a: min_ns must be finite and non-negative, "
                                                r"got -1\.0"),
    (_set_row(0, ["a", "1000", 900, 950, 1050, 1150, 25]), r"a: median_ns must be a number, "
                                                           r"got '1000'"),
    (_set_row(1, "b 1 2 3 4 1" + "0" * 400 + " 25"), r"b: max_ns must be finite and non-neg"),
    (_set_row(0, "a 1000 nan 950 1050 1150 25"), r"a: min_ns must be a number, got 'nan'"),
    (_set_row(0, "a 1000 1e999 950 1050 1150 25"), r"a: min_ns must be finite"),
    (_set_row(0, ["a", 1000, True, 950, 1050, 1150, 25]), r"a: min_ns must be a number, got True"),
    (_set_row(0, ["a", 1000, 900, 950, 1050, 1150, True]), r"samples must be a positive integer"),
    (_set_row(0, {"name": "a"}), r"a ranking row must be a string"),
    (_set("ranking", []), r"'ranking' must be a non-empty list"),
    (_set("tie", 1), r"'tie' must be true or false"),
    (_set("rejected", {"x": 1}), r"'rejected' must map candidate names"),
    (_set("confidence", 1.5), r"'confidence' must be in \[0, 1\]"),
    (_set("confidence", "high"), r"'confidence' must be a number"),
    (_set("device", 7), r"'device' must be a string"),
    (_set("provenance", []), r"'provenance' must be an object"),
    (lambda e: e[F["provenance"]].update(run=None), r"provenance 'run' None is not an index"),
    (lambda e: e[F["provenance"]].update(run=9), r"provenance 'run' 9 is not an index"),
    (lambda e: e.append("red"), r"an entry array must have 10 values"),
])
def test_invalid_entries_name_path_and_entry(tmp_path: Path, mutate: Callable[[list[Any]], None],
                                             message: str) -> None:
    path = tmp_path / "c.json"
    data = json.loads(write(path, entry()))
    mutate(data["entries"][0])
    path.write_text(json.dumps(data))
    with pytest.raises(artifacts.ArtifactError, match=f"c.json.*{message}"):
        artifacts.read_cache(path)


def hand_written(e: CacheEntry) -> dict[str, Any]:
    """``e`` as someone would write it by hand: an object, rows as arrays, a winner."""
    return {"device": e.device, "target": e.target, "op": e.op, "bucket": e.bucket,
            "dtype": e.dtype, "winner": e.winner, "confidence": e.confidence, "tie": e.tie,
            "ranking": [[r.name, *list(r.stats.to_dict().values())] for r in e.ranking],
            "rejected": dict(e.rejected), "provenance": dict(e.provenance)}


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda e: e.update(winner="b"), r"entries\[1\].*winner 'b' is not first"),
    (lambda e: e.update(color="red"), r"entries\[1\].*unknown fields \['color'\]"),
    (lambda e: e.pop("ranking"), r"entries\[1\].*'ranking' must be a non-empty list"),
    (lambda e: e.pop("dtype"), r"entries\[1\].*'dtype' must be a string, got None"),
])
def test_invalid_hand_written_entries_are_named(tmp_path: Path,
                                                mutate: Callable[[dict[str, Any]], None],
                                                message: str) -> None:
    path = tmp_path / "c.json"
    data = json.loads(write(path, entry("a")))
    item = hand_written(entry("b"))
    mutate(item)
    data["entries"].append(item)
    path.write_text(json.dumps(data))
    with pytest.raises(artifacts.ArtifactError, match=f"c.json.*{message}"):
        artifacts.read_cache(path)


def test_the_first_bad_entry_is_named_after_valid_hand_written_ones(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    data = json.loads(write(path, entry("a"), entry("c")))
    # hand-written but valid: an object, no winner, an integer confidence, no provenance
    item = hand_written(entry("b"))
    del item["winner"], item["provenance"]
    item["confidence"] = 1
    data["entries"].insert(1, item)
    data["entries"][2][F["ranking"]][0] = "a 1000 900 x 1050 1150 25"
    path.write_text(json.dumps(data))
    with pytest.raises(artifacts.ArtifactError,
                       match=r"c\.json: entries\[2\] is invalid: a: q1_ns must be a number"):
        artifacts.read_cache(path)
    del data["entries"][2]
    path.write_text(json.dumps(data))
    loaded = artifacts.read_cache(path).entries()
    assert [e.confidence for e in loaded] == [0.999, 1.0]
    assert loaded[1].winner == "a" and loaded[1].provenance == {}
    assert loaded[0].provenance["host"] == "h1"
    assert loaded == [entry("a"), CacheEntry(*entry("b").key[:4], "float32",
                                             entry("b").ranking, 1.0, False,
                                             entry("b").rejected, {})]


@pytest.mark.parametrize("header", ["entry_fields", "ranking_fields"])
def test_fields_in_another_order_are_refused(tmp_path: Path, header: str) -> None:
    path = tmp_path / "c.json"
    data = json.loads(write(path, entry()))
    data[header][1:3] = reversed(data[header][1:3])
    path.write_text(json.dumps(data))
    with pytest.raises(artifacts.ArtifactError, match=rf"c\.json: '{header}' is \["):
        artifacts.read_cache(path)


def test_loaded_entries_equal_built_ones_and_round_trip(tmp_path: Path) -> None:
    """Entries read from a file build their ranking and provenance on first use; they
    compare, merge and write exactly as the entries they were written from."""
    built = [entry("a"), entry("b", "b", runner_up="a", host="h2", confidence=0.5),
             entry("c", runner_up=None, spread=0.0),
             CacheEntry("dev0", "cpu", "matmul", "d", "float32",
                        (RankedCandidate("z", LatencyStats(2.0, 0.0, 1.0, 2.0, 3.0, 1)),))]
    path = tmp_path / "c.json"
    text = write(path, *built)
    loaded = artifacts.read_cache(path)
    assert {type(e).__name__ for e in loaded} == {"_LoadedEntry"}  # the fast path read it
    assert merge(loaded).entries == merge(built).entries  # before anything is built
    again = tmp_path / "again.json"
    artifacts.write_cache(again, loaded)
    assert again.read_bytes() == text
    assert loaded.entries() == sorted(built, key=lambda e: e.key)
    for e in loaded:  # now built
        assert isinstance(e.ranking[0].stats.median_ns, float)
        assert e.to_dict() == next(b for b in built if b.key == e.key).to_dict()
    artifacts.write_cache(again, loaded)
    assert again.read_bytes() == text
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        loaded.entries()[0].nonesuch  # type: ignore[attr-defined]  # noqa: B018


@pytest.mark.parametrize("row", [
    "a 1181.75 900 950 1050 1150 25",  # a decimal latency
    "a 1000 900 950 1050 1150 025",  # samples with a leading zero
    "a 1000 0900 950 1050 1150 25",  # a latency with a leading zero
    "a 12345678901234567891 900 950 1050 1150 25",  # more digits than a float holds
    "a 1e3 900 950 1050 1150 25",  # an exponent
    "a  b 1000 900 950 1050 1150 25",  # a double space in the name
])
def test_other_valid_rows_read_the_same_on_the_precise_path(tmp_path: Path, row: str) -> None:
    """A row the fast check does not take sends the whole file down the entry-by-entry
    path, which reads it as the same values."""
    path = tmp_path / "c.json"
    data = json.loads(write(path, entry("a"), entry("b")))
    data["entries"][1][F["ranking"]][0] = row
    path.write_text(json.dumps(data))
    loaded = artifacts.read_cache(path).entries()
    assert {type(e).__name__ for e in loaded} == {"CacheEntry"}
    name, *numbers, samples = row.rsplit(" ", 6)
    assert loaded[1].ranking[0] == RankedCandidate(
        name, LatencyStats(*(float(n) for n in numbers), int(samples)))
    assert loaded[0] == entry("a")
    # written back in the writer's form, which the fast path then reads the same
    again = write(tmp_path / "again.json", *loaded)
    assert write(tmp_path / "third.json", *artifacts.read_cache(tmp_path / "again.json")) == again
    # and, unless the row has what the writer keeps too (a double space in the name, a
    # latency past 15 digits), in the form the fast path takes
    fast = {type(e).__name__ for e in artifacts.read_cache(tmp_path / "again.json")}
    assert (fast == {"_LoadedEntry"}) == ("  " not in name and float(numbers[0]) < 1e15)


def test_names_with_spaces_take_the_fast_path(tmp_path: Path) -> None:
    spaced = entry("a", "tiled sgemm 64x64", runner_up="b")
    path = tmp_path / "c.json"
    write(path, spaced)
    loaded = artifacts.read_cache(path)
    assert {type(e).__name__ for e in loaded} == {"_LoadedEntry"}
    assert loaded.entries() == [spaced] and loaded.entries()[0].winner == "tiled sgemm 64x64"


_clean_row = st.tuples(
    st.text(alphabet="ab_ 019", min_size=1, max_size=6),
    st.lists(st.one_of(st.text(alphabet="0123456789", min_size=1, max_size=5),
                       st.text(alphabet="09", min_size=14, max_size=20)),
             min_size=6, max_size=6),
).map(lambda row: " ".join([row[0], *row[1]]))
# near misses: a clean row with a few characters put in or cut out somewhere
_near_miss = st.tuples(_clean_row, st.integers(0, 40), st.integers(0, 2),
                       st.text(alphabet="a0 1.-e\n+", max_size=2)).map(
    lambda t: t[0][:t[1]] + t[3] + t[0][t[1] + t[2]:])
rows_st = st.lists(st.one_of(_clean_row, _near_miss), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(rows_st)
@example(["a 1 2 3 4 5 6\n7", "b 1 2 3 4 5 6"])  # a line break inside a row
@example(["a 1 2 3 4 5 0"])  # zero samples
@example(["a 1 2 3 4 5 00", "b 1 2 3 4 5 6"])
@example(["a 1 2 3 4 \u0665 6"])  # a digit that is not ASCII
@example(["a 1  2 3 4 5"])  # an empty field
@example(["a 1 2 3 4 5 "])
@example([" 1 2 3 4 5 6"])  # an empty name
@example(["a 1 2 3 4 -5 6"])
@example(["a\nb 1 2 3 4 5 6"])  # a line break in the name
def test_the_fast_row_check_only_takes_rows_the_precise_path_reads_the_same(
        rows: list[str]) -> None:
    if not _rows_valid(rows):
        return
    for row in rows:
        assert _candidate(row) == _parse_row(row)


def _document(*entries: CacheEntry) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(json.dumps(cache_document(entries)))
    return parsed


_field_changes = st.sampled_from([
    ("confidence", float("nan")), ("confidence", 1), ("confidence", -0.0), ("confidence", 2.0),
    ("tie", 0), ("tie", None), ("device", 3), ("bucket", ""), ("rejected", {"x": None}),
    ("rejected", []), ("provenance", {"run": True}), ("provenance", {"run": -1}),
    ("provenance", {"run": 1}), ("provenance", {}), ("ranking", ["a 1 2 3 4 5 6", 7]),
    ("ranking", []), ("ranking", "a 1 2 3 4 5 6"),
])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), _field_changes), max_size=2))
def test_the_fast_load_only_takes_documents_the_precise_path_reads_the_same(
        changes: list[tuple[int, tuple[str, object]]]) -> None:
    doc = _document(entry("a"), entry("b", "b", runner_up="a", host="h2"),
                    entry("c", runner_up=None, confidence=1.0))
    for index, (name, value) in changes:
        doc["entries"][index][F[name]] = value
    fast = _load_fast(doc["entries"], doc["runs"])
    if fast is None:
        return
    for key, loaded, raw in zip(*fast, doc["entries"], strict=True):
        precise = _parse_entry(json.loads(json.dumps(raw)), doc["runs"])
        assert loaded.key == key == precise.key
        assert loaded.to_dict() == precise.to_dict() and loaded == precise
        assert evidence(loaded) == evidence(precise)


def test_a_nan_confidence_is_refused_even_without_the_json_reader() -> None:
    doc = _document(entry("a"), entry("b"))
    doc["entries"][1][F["confidence"]] = float("nan")
    with pytest.raises(ValueError, match=r"entries\[1\] is invalid: 'confidence' must be in"):
        MeasureCache.from_dict(doc)


def test_a_non_finite_latency_is_an_artifact_error_on_write(tmp_path: Path) -> None:
    bad = CacheEntry("dev0", "cpu", "matmul", "x", "float32", (RankedCandidate(
        "k", LatencyStats(float("inf"), 1.0, 1.0, 1.0, 1.0, 3)),))
    with pytest.raises(artifacts.ArtifactError, match="a latency must be finite, got inf"):
        artifacts.write_cache(tmp_path / "c.json", MeasureCache([bad]))
    assert not (tmp_path / "c.json").exists()


def test_a_version_1_file_is_read_and_written_as_version_2(tmp_path: Path) -> None:
    """Version 1: an object per entry with a winner, ranking rows arrays of numbers."""
    old = {"schema": "pytest-arbiter/cache", "version": 1,
           "ranking_fields": list(RANKING_FIELDS), "runs": [], "entries": [
               {**hand_written(e), "provenance": {"rounds": 25}} for e in
               (entry("a"), entry("b", "b", runner_up="a"))]}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    loaded = artifacts.read_cache(path).entries()
    assert [e.winner for e in loaded] == ["a", "b"]
    assert loaded[0].ranking == entry("a").ranking
    artifacts.write_cache(path, MeasureCache(loaded))
    assert json.loads(path.read_text())["version"] == CACHE_VERSION == 2


def test_loaded_entries_copy_pickle_and_replace(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write(path, entry("a"))
    loaded = artifacts.read_cache(path).entries()[0]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(loaded, protocol)) == loaded
    assert copy.deepcopy(loaded) == loaded == copy.copy(loaded)
    tied = dataclasses.replace(loaded, tie=True)
    assert type(tied) is CacheEntry and tied.tie and not loaded.tie
    assert tied.ranking == loaded.ranking and tied.provenance == loaded.provenance


def test_provenance_values_of_another_json_type_make_another_entry(tmp_path: Path) -> None:
    """25 and 25.0 are == in Python but not the same JSON: the entries differ, and the
    merge rule's canonical tie-break picks the same one whatever the order."""
    path = tmp_path / "c.json"
    text = write(path, entry("a")).decode()
    assert '"rounds": 25,' in text
    (tmp_path / "float.json").write_text(text.replace('"rounds": 25,', '"rounds": 25.0,'))
    a, b = (artifacts.read_cache(tmp_path / name) for name in ("c.json", "float.json"))
    ea, eb = a.entries()[0], b.entries()[0]
    assert ea != eb and prefer(ea, eb) is prefer(eb, ea)
    assert ea.canonical() != eb.canonical()
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    artifacts.write_cache(one, merge(a, b).cache())
    artifacts.write_cache(two, merge(b, a).cache())
    assert one.read_bytes() == two.read_bytes()


def test_merging_a_cache_with_its_own_reload_builds_nothing(tmp_path: Path) -> None:
    """Two reads of one file (a corpus merged with a shard cut from it, or itself)."""
    path = tmp_path / "c.json"
    write(path, *(entry(f"b{i}", host=f"h{i % 3}") for i in range(50)))
    first, second = artifacts.read_cache(path), artifacts.read_cache(path)
    result = merge(first, second)
    assert len(result.entries) == 50 and not result.conflicts
    assert not [e for e in (*first, *second) if "ranking" in vars(e) or "provenance" in vars(e)]


def test_loaded_entries_of_different_runs_differ(tmp_path: Path) -> None:
    """The same array (run 0) in two files whose run 0 differs: two different entries."""
    write(tmp_path / "h1.json", entry("a", host="h1"))
    write(tmp_path / "h2.json", entry("a", host="h2"))
    one, two = (artifacts.read_cache(tmp_path / f"{h}.json").entries()[0] for h in ("h1", "h2"))
    assert one != two and one.provenance["host"] == "h1"


def test_non_finite_numbers_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    text = write(path, entry()).decode().replace('"float32", 0.999,', '"float32", NaN,')
    path.write_text(text)
    with pytest.raises(artifacts.ArtifactError, match=r"c\.json is not valid JSON: NaN"):
        artifacts.read_cache(path)


def test_truncated_corpus_is_a_clear_error_and_stays_untouched(tmp_path: Path) -> None:
    path = tmp_path / "corpus.json"
    full = write(path, entry("a"), entry("b"))
    cut = full[: len(full) // 2]
    path.write_bytes(cut)
    with pytest.raises(artifacts.ArtifactError,
                       match=r"corpus.json is not valid JSON: .* at line \d+, column \d+ "
                             r"\(char \d+\)"):
        artifacts.read_cache(path)
    with pytest.raises(artifacts.ArtifactError, match=r"corpus\.json is not valid JSON"):
        artifacts.update_cache(path, [entry("c")])
    assert path.read_bytes() == cut
    assert not list(tmp_path.glob(".corpus.json.*.tmp"))


def test_an_entry_of_another_device_is_never_used(tmp_path: Path,
                                                  registry: CandidateRegistry) -> None:
    a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    cache = MeasureCache()
    first = measured_arbitrate("matmul", (a, a), registry.for_op("matmul"), cache,
                               policy=FAST)
    mine = cache.entries()[0]
    foreign = CacheEntry("other-device", mine.target, mine.op, mine.bucket, mine.dtype,
                         (RankedCandidate("no_such_kernel", stats(1000.0)),), 1.0)
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([foreign]))
    loaded = artifacts.read_cache(path)
    sel = measured_arbitrate("matmul", (a, a), registry.for_op("matmul"), loaded,
                             policy=FAST)
    assert sel.source == "measured" and sel.candidate is not None
    assert sel.candidate.name != "no_such_kernel" and first.candidate is not None
    assert loaded.get(foreign.key) == foreign and len(loaded) == 2


def test_a_key_listed_twice_keeps_the_preferred_entry(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    data = json.loads(write(path, entry(confidence=0.999)))
    weaker = json.loads(json.dumps(data["entries"][0]))
    weaker[F["confidence"]] = 0.5
    weaker[F["ranking"]].reverse()
    data["entries"].insert(0, weaker)
    path.write_text(json.dumps(data))
    assert artifacts.read_cache(path).entries()[0].winner == "a"


# -- the merge rule -----------------------------------------------------------------------


def test_merge_prefers_confidence_then_samples_then_spread() -> None:
    strong = entry(winner="a", confidence=0.999)
    weak = entry(winner="b", runner_up="a", confidence=0.9, samples=200)
    assert prefer(strong, weak) is strong and prefer(weak, strong) is strong
    more = entry(winner="b", runner_up="a", samples=50)
    assert prefer(entry(samples=25), more) is more
    tight = entry(winner="b", runner_up="a", spread=0.01)
    assert prefer(entry(spread=0.2), tight) is tight
    # all evidence equal: a deterministic choice, whatever the order
    x, y = entry(host="h1"), entry(host="h2")
    assert prefer(x, y) is prefer(y, x)


def test_merge_reports_true_conflicts_only() -> None:
    a = entry(winner="a", runner_up="b", host="h1")
    b = entry(winner="b", runner_up="a", host="h2", samples=50)
    unsure = entry(winner="c", runner_up="a", host="h3", confidence=0.6)
    tied = entry(winner="d", runner_up="a", host="h4", tie=True, confidence=0.995)
    result = merge([a], [b], [unsure], [tied])
    assert result.entries[a.key] is b
    assert [(c.kept.winner, c.other.winner) for c in result.conflicts] == [("b", "a")]
    assert "kept b (host h2" in result.conflicts[0].describe()
    assert merge([a], [a]).conflicts == [] and merge([a], [unsure]).conflicts == []
    backwards = merge([tied], [unsure], [b], [a])
    assert backwards.conflicts == result.conflicts


def test_diff_reports_changed_winners_and_by_how_much() -> None:
    old = [entry("x", "a"), entry("gone")]
    new_x = CacheEntry("dev0", "cpu", "matmul", "x", "float32",
                       (RankedCandidate("b", stats(800.0)), RankedCandidate("a", stats(1200.0))))
    d = diff(old, [new_x, entry("new")])
    assert [(c.old.winner, c.new.winner) for c in d.changed] == [("a", "b")]
    change = d.changed[0]
    assert change.change == pytest.approx(-0.2) and change.margin == pytest.approx(0.5)
    assert [e.bucket for e in d.added] == ["new"] and [e.bucket for e in d.removed] == ["gone"]


NAMES = ("a", "b", "c")
entries_st = st.builds(
    lambda bucket, names, med, samples, spread, conf, tie, host: entry(
        bucket, names[0], confidence=conf, samples=samples, spread=spread, tie=tie,
        host=host, runner_up=names[1] if len(names) > 1 else None),
    st.sampled_from(("b1", "b2", "b3")),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True),
    st.just(1000.0), st.sampled_from((1, 25)), st.sampled_from((0.0, 0.1)),
    st.sampled_from((0.5, 0.99, 1.0)), st.booleans(), st.sampled_from(("h1", "h2")))
caches_st = st.lists(entries_st, max_size=6).map(lambda es: merge(es).entries)


def _same(x: dict[tuple[str, ...], CacheEntry], y: dict[tuple[str, ...], CacheEntry]) -> None:
    assert x == y
    assert json.dumps(cache_document(x.values())) == json.dumps(cache_document(y.values()))


@settings(max_examples=150, deadline=None)
@given(caches_st, caches_st, caches_st)
def test_merge_is_commutative_associative_idempotent(a: dict, b: dict, c: dict) -> None:  # type: ignore[type-arg]
    ab = merge(a, b)
    _same(ab.entries, merge(b, a).entries)
    assert ab.conflicts == merge(b, a).conflicts
    _same(merge(ab.entries, c).entries, merge(a, merge(b, c).entries).entries)
    _same(merge(a, a).entries, a)
    _same(merge(a).entries, a)


def _loaded(entries: dict) -> MeasureCache:  # type: ignore[type-arg]
    """The cache as read back from its document: entries built on first use."""
    return MeasureCache.from_dict(json.loads(json.dumps(cache_document(entries.values()))))


@settings(max_examples=100, deadline=None)
@given(caches_st, caches_st, caches_st)
def test_merging_caches_and_loaded_caches_is_the_same_merge(a: dict, b: dict, c: dict  # type: ignore[type-arg]
                                                            ) -> None:
    """Caches are merged key set by key set, and loaded entries compare by their raw
    rows: neither may change the result of the entry-by-entry merge."""
    want = merge(a, b, c)
    for parts in ((MeasureCache(a.values()), MeasureCache(b.values()), MeasureCache(c.values())),
                  (_loaded(a), _loaded(b), _loaded(c)), (a, _loaded(b), MeasureCache(c.values()))):
        got = merge(*parts)
        _same(got.entries, want.entries)
        assert got.conflicts == want.conflicts
    # latencies go through the file in whole nanoseconds: the stored entries are fixed
    _same(merge(_loaded(a)).entries, merge(_loaded(_loaded(a).by_key())).entries)


# -- atomic writes and the lock -----------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pytest_arbiter import artifacts
    from pytest_arbiter.cache import CacheEntry, RankedCandidate
    from pytest_arbiter.measure import LatencyStats

    path, worker, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    stats = LatencyStats(10.0, 9.0, 9.5, 10.5, 12.0, 5)
    while not go.exists():
        time.sleep(0.002)
    for r in range(rounds):
        e = CacheEntry("dev", "cpu", "matmul", f"w{worker}-r{r}", "float32",
                       (RankedCandidate("k", stats),), 1.0, False, {}, {"host": f"w{worker}"})
        artifacts.update_cache(path, [e])
""")


def test_eight_processes_adding_entries_concurrently_lose_none(tmp_path: Path) -> None:
    path, go = tmp_path / "cache.json", tmp_path / "go"
    workers, rounds = 8, 25
    write(path, entry("seed"))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(w), str(rounds),
                               str(go)]) for w in range(workers)]
    time.sleep(0.5)
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0] * workers
    cache = artifacts.read_cache(path)
    expected = {f"w{w}-r{r}" for w in range(workers) for r in range(rounds)} | {"seed"}
    assert {e.bucket for e in cache.entries()} == expected
    assert not list(tmp_path.glob(".cache.json.*.tmp"))


KILLED = textwrap.dedent("""
    import os, signal, sys
    from pytest_arbiter import artifacts
    from pytest_arbiter.cache import CacheEntry, RankedCandidate
    from pytest_arbiter.measure import LatencyStats

    def die(src, dst):
        os.kill(os.getpid(), signal.SIGKILL)

    artifacts.os.replace = die  # the temporary file is written and fsynced; no rename
    e = CacheEntry("dev", "cpu", "matmul", "killed", "float32",
                   (RankedCandidate("k", LatencyStats(1.0, 1.0, 1.0, 1.0, 1.0, 3)),))
    artifacts.update_cache(sys.argv[1], [e])
""")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_writer_killed_before_rename_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    before = write(path, entry("old"))
    proc = subprocess.run([sys.executable, "-c", KILLED, str(path)], timeout=60)
    assert proc.returncode == -9
    assert path.read_bytes() == before
    stale = list(tmp_path.glob(".cache.json.*.tmp"))
    assert len(stale) == 1 and b'"killed"' in stale[0].read_bytes()
    # the dead writer's lock is gone with it; the next writer cleans up after it
    artifacts.update_cache(path, [entry("new")], timeout=10)
    assert {e.bucket for e in artifacts.read_cache(path).entries()} == {"old", "new"}
    assert not list(tmp_path.glob(".cache.json.*.tmp"))


def test_lock_timeout_is_a_clear_error(tmp_path: Path) -> None:
    import filelock

    path = tmp_path / "cache.json"
    before = write(path, entry())
    with filelock.FileLock(str(artifacts.lock_path(path))):
        code = ("import sys; from pytest_arbiter import artifacts\n"
                "try:\n    artifacts.update_cache(sys.argv[1], [], timeout=0.2)\n"
                "except artifacts.ArtifactError as e:\n    print(e); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "cache.json.lock stayed locked for 0.2 s" in proc.stdout
    assert path.read_bytes() == before


def test_write_error_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(artifacts.ArtifactError, match=r"no/such/c\.json"):
        artifacts.update_cache(tmp_path / "no" / "such" / "c.json", [entry()])
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_atomic_write_keeps_normal_permissions(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write(path, entry())
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    path.chmod(0o640)
    write(path, entry("other"))
    assert path.stat().st_mode & 0o777 == 0o640


# -- the plugin's cache write -------------------------------------------------------------

TUNE_TEST = """
import numpy as np
from pytest_arbiter import artifacts
from pytest_arbiter.cache import CacheEntry, RankedCandidate
from pytest_arbiter.measure import LatencyStats

def test_tune(arbiter):
    a = np.ones((16, 16), np.float32)
    arbiter.dispatch("matmul", a, a)
    # another runner adds an entry to the same cache while this run is going
    other = CacheEntry("other-runner-device", "cpu", "matmul", "b", "float32",
                       (RankedCandidate("k", LatencyStats(1.0, 1.0, 1.0, 1.0, 1.0, 3)),))
    artifacts.update_cache("cache.json", [other])
"""


def test_tune_merges_into_the_cache_and_keeps_what_others_wrote(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tune=TUNE_TEST)
    write(pytester.path / "cache.json", entry("from-the-corpus"))
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == 0, result.stdout.str()
    devices = {e.device: e.bucket for e in artifacts.read_cache(pytester.path / "cache.json")}
    assert devices.pop("other-runner-device") == "b"
    assert devices.pop("dev0") == "from-the-corpus"
    assert list(devices) == [cpu_device().tag]


FORGET_TEST = """
import numpy as np
from pytest_arbiter import artifacts
from pytest_arbiter.cache import MeasureCache

def test_tune(arbiter):
    a = np.ones((16, 16), np.float32)
    arbiter.dispatch("matmul", a, a)
    # someone deletes the corpus's other entries while this run is going
    kept = [e for e in artifacts.read_cache("cache.json") if e.bucket != "forgotten"]
    artifacts.write_cache("cache.json", MeasureCache(kept))
"""


def test_tune_adds_only_what_it_measured(pytester: pytest.Pytester) -> None:
    """The run read the entry that was deleted during it; it must not bring it back."""
    pytester.makepyfile(test_tune=FORGET_TEST)
    write(pytester.path / "cache.json", entry("forgotten"), entry("kept"))
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == 0, result.stdout.str()
    buckets = {e.bucket for e in artifacts.read_cache(pytester.path / "cache.json")}
    assert "forgotten" not in buckets and "kept" in buckets and len(buckets) == 2


def test_tune_that_measures_nothing_leaves_the_cache_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tune=TUNE_TEST.replace("artifacts.update_cache", "print"))
    path = pytester.path / "cache.json"
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == 0, result.stdout.str()
    before = path.read_bytes()
    os.utime(path, ns=(0, 0))
    again = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert again.ret == 0, again.stdout.str()
    again.stdout.fnmatch_lines(["*0 measured, 1 reused from cache*"])
    assert path.read_bytes() == before and path.stat().st_mtime_ns == 0


def test_tune_with_a_truncated_cache_is_a_usage_error_and_writes_nothing(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_tune=TUNE_TEST.replace("artifacts.update_cache", "print"))
    path = pytester.path / "cache.json"
    full = write(path, entry("a"), entry("b"))
    path.write_bytes(full[:-30])
    result = pytester.runpytest("--arbiter-tune", "--arbiter-cache=cache.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cache.json*not valid JSON*line*column*"])
    assert path.read_bytes() == full[:-30]
