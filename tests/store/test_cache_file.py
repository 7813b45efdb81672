"""The cache artifact and the fleet corpus: the schema, migration, atomicity, locking,
and the merge rule."""

from __future__ import annotations

import copy
import datetime
import gc
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

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.decision.tuning import measured_arbitrate
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import (
    CACHE_VERSION,
    NO_SINCE,
    CacheEntry,
    Considered,
    MeasureCache,
    Provenance,
    RankedCandidate,
    since_for,
)
from pytest_arbiter.store.cache_file import (
    convert_document,
    decode_document,
    document_builtins,
    encode_document,
)
from pytest_arbiter.store.corpus import diff, merge, prefer
from pytest_arbiter.timing.measure import ComparePolicy, LatencyStats
from tests.factories import ROOT

FAST = ComparePolicy(warmup=1, min_rounds=3, max_rounds=5, budget_s=0.001)
DATA = Path(__file__).with_name("data")
UTC = datetime.timezone.utc
T0 = datetime.datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
T1 = datetime.datetime(2026, 12, 2, 6, 0, tzinfo=UTC)


def stats(median: float, samples: int = 25, spread: float = 0.1) -> LatencyStats:
    half = median * spread / 2
    return LatencyStats(median, median - 2 * half, median - half, median + half,
                        median + 3 * half, samples)


def entry(bucket: str = "m32-n16-k32", winner: str = "a", *, device: str = "dev0",
          confidence: float = 0.999, samples: int = 25, spread: float = 0.1,
          tie: bool = False, host: str = "h1", runner_up: str | None = "b",
          fingerprints: dict[str, str] | None = None, since: datetime.datetime = NO_SINCE,
          environment: dict[str, str] | None = None, median: float = 1000.0) -> CacheEntry:
    ranking = [RankedCandidate(winner, stats(median, samples, spread))]
    if runner_up is not None:
        ranking.append(RankedCandidate(runner_up, stats(median * 1.5, samples, spread)))
    prov = {"host": host, "device_name": "Test Device", "measured_at": "2026-12-03T06:00:00Z",
            "versions": {"pytest-arbiter": "0.1.0"}, "rounds": samples, "timed_ns": 12345,
            "shapes": [[32, 32], [32, 16]]}
    considered = {name: Considered(fp, "timed") for name, fp in (fingerprints or {}).items()}
    return CacheEntry(device, "cpu", "matmul", bucket, "float32", tuple(ranking), confidence,
                      tie, {"slow": "failed the F4 gate: too far"}, prov, considered,
                      environment or {}, since=since)


def write(path: Path, *entries: CacheEntry) -> bytes:
    artifacts.write_cache(path, MeasureCache(entries))
    return path.read_bytes()


def document(*entries: CacheEntry) -> dict[str, Any]:
    """The file of ``entries`` as parsed JSON, to change and write back."""
    parsed: dict[str, Any] = json.loads(encode_document(entries))
    return parsed


def refused(tmp_path: Path, doc: Any, match: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ArtifactError, match=match):
        artifacts.read_cache(path)


# -- the format ---------------------------------------------------------------------------


def test_write_read_write_is_byte_identical(tmp_path: Path, registry: CandidateRegistry
                                           ) -> None:
    cache = MeasureCache([entry("b1"), entry("b2", "b", host="h2", confidence=0.5)])
    a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    measured_arbitrate("matmul", (a, a), registry.for_op("matmul"), cache, policy=FAST)
    first = tmp_path / "c.json"
    artifacts.write_cache(first, cache)
    text = first.read_bytes()
    assert text.endswith(b"}\n") and b"NaN" not in text and b"null" not in text
    again = tmp_path / "again.json"
    artifacts.write_cache(again, artifacts.read_cache(first))
    assert again.read_bytes() == text
    loaded = artifacts.read_cache(first)
    assert len(loaded) == 3 and loaded.entries() == cache.entries()
    measured = next(e for e in loaded.entries() if e.device == cpu_device().tag)
    assert measured.provenance.device_name == cpu_device().name
    assert measured.samples >= 1 and measured.spread >= 0


def test_the_file_is_named_fields_one_entry_a_line_with_shared_tables() -> None:
    env = {"numpy": "2.4.6", "device_name": "Test Device"}
    fps = {"a": "f" * 16, "b": "e" * 16}
    text = encode_document([entry("z", environment=env, fingerprints=fps, since=T0),
                            entry("a", environment=env, fingerprints=fps, since=T0),
                            entry("m", host="h2")]).decode()
    lines = text.splitlines()
    assert lines[:3] == ["{", '  "schema": "pytest-arbiter/cache",', '  "version": 3,']
    doc = json.loads(text)
    assert list(doc) == ["schema", "version", "runs", "environments", "considered", "entries"]
    assert [r["host"] for r in doc["runs"]] == ["h1", "h2"]  # sorted, each once
    assert doc["environments"] == [{"device_name": "Test Device", "numpy": "2.4.6"}]
    assert doc["considered"] == [{"a": {"fingerprint": "f" * 16, "outcome": "timed"},
                                  "b": {"fingerprint": "e" * 16, "outcome": "timed"}}]
    assert [e["bucket"] for e in doc["entries"]] == ["a", "m", "z"]
    first = doc["entries"][0]
    assert list(first) == ["device", "target", "op", "bucket", "dtype", "ranking",
                           "confidence", "rejected", "provenance", "considered",
                           "environment", "since"]
    assert first["ranking"][0] == {"name": "a", "stats": {
        "median_ns": 1000, "min_ns": 900, "q1_ns": 950, "q3_ns": 1050, "max_ns": 1150,
        "samples": 25}}
    assert first["provenance"] == {"run": 0, "measured_at": "2026-12-03T06:00:00Z",
                                   "shapes": "32x32,32x16", "rounds": 25,
                                   "timed_ns": 12345}
    assert (first["considered"], first["environment"], first["since"]) == (
        0, 0, "2026-12-01T06:00:00Z")
    assert "considered" not in doc["entries"][1]  # what an entry does not know is left out
    entry_lines = [line for line in lines if line.startswith('    {"device":')]
    assert len(entry_lines) == 3 and all(json.loads(line.rstrip(",")) for line in entry_lines)


def test_an_entry_built_in_code_holds_what_a_read_gives_back(tmp_path: Path) -> None:
    """Whole latencies are integers, other numbers floats, ``since`` in UTC: the first
    write is already the fixed point (read, write: the same bytes)."""
    built = CacheEntry("dev0", "cpu", "matmul", "f", "float32",
                       [RankedCandidate("k", LatencyStats(1181.0, 0.25, 1100, 1250.5, 2e12, 3))],
                       1, since=datetime.datetime(2026, 1, 1, 7, tzinfo=datetime.timezone(
                           datetime.timedelta(hours=1))))
    held = built.ranking[0].stats
    assert held == LatencyStats(1181, 0.25, 1100, 1250.5, 2 * 10**12, 3)
    assert [type(v) for v in (held.median_ns, held.min_ns, held.max_ns)] == [int, float, int]
    assert type(built.confidence) is float and type(built.ranking) is tuple
    assert built.since == datetime.datetime(2026, 1, 1, 6, tzinfo=UTC)
    text = write(tmp_path / "c.json", built)
    assert b'"median_ns":1181,"min_ns":0.25' in text and b'"max_ns":2000000000000,' in text
    assert b'"confidence":1.0' in text and b'"since":"2026-01-01T06:00:00Z"' in text
    assert write(tmp_path / "again.json", *artifacts.read_cache(tmp_path / "c.json")) == text


def test_the_documented_example_reads_and_writes_back_byte_identical(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "artifacts.md"
    example = doc.read_text().split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.json"
    path.write_text(example)
    cache = artifacts.read_cache(path)
    assert [e.winner for e in cache.entries()] == ["dot_matmul", "inplace_softmax"]
    assert write(tmp_path / "again.json", *cache.entries()).decode() == example


def test_newer_schema_version_is_refused_naming_both(tmp_path: Path) -> None:
    doc = document(entry())
    doc["version"] = CACHE_VERSION + 1
    refused(tmp_path, doc, rf"c.json: cache schema version {CACHE_VERSION + 1} is newer "
                           rf"than version {CACHE_VERSION}")
    doc["unknown"] = True  # a newer file may have new fields: still the version is named
    refused(tmp_path, doc, rf"c.json: cache schema version {CACHE_VERSION + 1} is newer")


def _at(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set ``value`` at ``path`` (``entries.0.ranking.0.stats.samples``) of a document."""
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]

    def mutate(doc: dict[str, Any]) -> None:
        node: Any = doc
        for part in parents:
            node = node[part]
        node[last] = value
    return mutate


@pytest.mark.parametrize(("mutate", "message"), [
    (_at("entries.0.ranking.0.stats.samples", 0),
     r"Expected `int` >= 1 - at `\$.entries\[0\].ranking\[0\].stats.samples`"),
    (_at("entries.0.ranking.0.stats.samples", 2.5),
     r"Expected `int`, got `float` - at `\$.entries\[0\].ranking\[0\].stats.samples`"),
    (_at("entries.0.ranking.1.stats.min_ns", -1),
     r"Expected `int` >= 0 - at `\$.entries\[0\].ranking\[1\].stats.min_ns`"),
    (_at("entries.0.ranking.0.stats.median_ns", "fast"),
     r"Expected `int \| float`, got `str` - at `\$.entries\[0\].ranking\[0\].stats.median_ns`"),
    (_at("entries.0.ranking.0.name", ""), r"Expected `str` of length >= 1.*ranking\[0\].name"),
    (_at("entries.0.ranking.0.stats.speed", 1),
     r"Object contains unknown field `speed` - at `\$.entries\[0\].ranking\[0\].stats`"),
    (_at("entries.0.ranking", []), r"Expected `array` of length >= 1.*entries\[0\].ranking`"),
    (_at("entries.0.confidence", 1.5), r"Expected `float` <= 1.0.*entries\[0\].confidence`"),
    (_at("entries.0.tie", 1), r"Expected `bool`, got `int` - at `\$.entries\[0\].tie`"),
    (_at("entries.0.device", 7), r"Expected `str`, got `int` - at `\$.entries\[0\].device`"),
    (_at("entries.0.rejected", {"x": 1}), r"Expected `str`, got `int`.*entries\[0\].rejected"),
    (_at("entries.0.color", "red"),
     r"Object contains unknown field `color` - at `\$.entries\[0\]`"),
    (_at("entries.0.provenance.rounds", 25.0), r"Expected `int`, got `float`.*rounds`"),
    (_at("entries.0.provenance.host", "h"),
     r"Object contains unknown field `host` - at `\$.entries\[0\].provenance`"),
    (_at("entries.0.provenance.run", 9), r"9 is not an index into 'runs', which has 1 rows"),
    (_at("entries.0.provenance.run", -1),
     r"Expected `int` >= 0 - at `\$.entries\[0\].provenance.run`"),
    (_at("entries.0.considered", 1), r"1 is not an index into 'considered', which has 1 row"),
    (_at("entries.0.environment", "0"), r"Expected `int \| object`, got `str`.*environment`"),
    (_at("entries.0.since", "2026-12-01T06:00:00"),
     r"Expected `datetime` with a timezone component - at `\$.entries\[0\].since`"),
    (_at("considered.0.a.outcome", "won"),
     r"Invalid enum value 'won' - at `\$.considered\[0\]\[...\].outcome`"),
    (_at("considered.0.a.fingerprint", ""),
     r"Expected `str` of length >= 1 - at `\$.considered\[0\]\[...\].fingerprint`"),
    (_at("runs.0.host", 3), r"Expected `str`, got `int` - at `\$.runs\[0\].host`"),
    (_at("runs.0.when", "now"), r"Object contains unknown field `when` - at `\$.runs\[0\]`"),
    (_at("environments.0.numpy", 2), r"Expected `str`, got `int` - at `\$.environments\[0\]"),
    (_at("entries", {}), r"Expected `array`, got `object` - at `\$.entries`"),
    (_at("shards", []), r"Object contains unknown field `shards`$"),
])
def test_a_bad_value_is_refused_naming_the_file_and_its_json_path(
        tmp_path: Path, mutate: Callable[[dict[str, Any]], None], message: str) -> None:
    doc = document(entry("a", fingerprints={"a": "f" * 16}, environment={"numpy": "2"},
                         since=T0), entry("b"))
    mutate(doc)
    refused(tmp_path, doc, f"c.json: {message}")


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1e309"])
@pytest.mark.parametrize("where", ["entries.0.ranking.0.stats.max_ns",
                                   "entries.0.provenance.p_value", "entries.0.confidence"])
def test_a_number_out_of_a_doubles_range_is_refused(tmp_path: Path, number: str,
                                                    where: str) -> None:
    """``1e400`` reads as infinity: it was accepted, then broke ``show --json``, merges
    and every later write."""
    doc = document(entry("a", since=T0), entry("b"))
    _at(where, 12345.0)(doc)
    text = json.dumps(doc).replace("12345.0", number)
    refused(tmp_path, text, r"c.json: .*(out of range|>=|<=).*" + where.split(".")[-1])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literals_are_refused(tmp_path: Path, literal: str) -> None:
    text = encode_document([entry()]).decode().replace('"confidence":0.999',
                                                       f'"confidence":{literal}')
    refused(tmp_path, text, r"c\.json is not valid JSON: .* at line \d+, column \d+")


def test_an_entry_built_in_code_is_checked_as_a_read_would_check_it() -> None:
    with pytest.raises(ValueError, match=r"cache entry dev0/cpu/matmul/x/float32: "
                                         r".*>= 0.0.*`\$.ranking\[0\].stats.median_ns`"):
        CacheEntry("dev0", "cpu", "matmul", "x", "float32",
                   (RankedCandidate("k", LatencyStats(float("nan"), 1, 1, 1, 1, 3)),))
    with pytest.raises(ValueError, match=r"<= 1.7976931348623157e\+308.*median_ns"):
        CacheEntry("dev0", "cpu", "matmul", "x", "float32",
                   (RankedCandidate("k", LatencyStats(float("inf"), 1, 1, 1, 1, 3)),))
    with pytest.raises(ValueError, match=r"unknown provenance keys \['colour'\]"):
        CacheEntry("dev0", "cpu", "matmul", "x", "float32", (RankedCandidate("k", stats(1)),),
                   provenance={"colour": "red"})
    with pytest.raises(ValueError, match="length >= 1"):
        CacheEntry("dev0", "cpu", "matmul", "x", "float32", ())
    with pytest.raises(ValueError, match="since must carry a time zone"):
        CacheEntry("dev0", "cpu", "matmul", "x", "float32", (RankedCandidate("k", stats(1)),),
                   since=datetime.datetime(2026, 1, 1))


def test_an_unknown_outcome_is_refused_in_code_too() -> None:
    with pytest.raises(ValueError, match=r"Invalid enum value 'won' - at `\$.considered\[...\]"):
        CacheEntry("d", "cpu", "matmul", "x", "float32", (RankedCandidate("k", stats(1)),),
                   considered={"a": Considered("f", "won")})  # type: ignore[arg-type]


def test_a_hand_written_file_may_inline_the_shared_data_and_order_it_as_it_likes(
        tmp_path: Path) -> None:
    """Tables optional, after the entries, or the shared objects inline in an entry."""
    built = entry("a", fingerprints={"a": "f" * 16}, environment={"numpy": "2"}, since=T0)
    doc = document(built)
    inline = dict(doc["entries"][0])
    inline["considered"] = doc["considered"][0]
    inline["environment"] = doc["environments"][0]
    inline["provenance"] = {**inline["provenance"], "run": doc["runs"][0]}
    for text in (json.dumps({"entries": doc["entries"], **{k: v for k, v in doc.items()
                                                          if k != "entries"}}),
                 json.dumps({"schema": doc["schema"], "version": 3, "entries": [inline]})):
        path = tmp_path / "hand.json"
        path.write_text(text)
        assert artifacts.read_cache(path).entries() == [built]
    minimal = {"version": 3, "schema": "pytest-arbiter/cache", "entries": [
        {"device": "d", "target": "cpu", "op": "matmul", "bucket": "b", "dtype": "float32",
         "ranking": [{"name": "k", "stats": {"median_ns": 1, "min_ns": 1, "q1_ns": 1,
                                             "q3_ns": 1, "max_ns": 1, "samples": 1}}]}]}
    (tmp_path / "min.json").write_text(json.dumps(minimal))
    loaded = artifacts.read_cache(tmp_path / "min.json").entries()[0]
    assert loaded.confidence == 1.0 and loaded.since == NO_SINCE and not loaded.considered


def test_a_schema_that_is_not_the_cache_is_refused(tmp_path: Path) -> None:
    refused(tmp_path, {"schema": "pytest-arbiter/histogram", "version": 1, "entries": []},
            r"c.json: schema is 'pytest-arbiter/histogram', expected 'pytest-arbiter/cache'")
    refused(tmp_path, {"schema": "pytest-arbiter/cache", "version": "3", "entries": []},
            r"c.json: cache version '3' is not a positive integer")
    refused(tmp_path, "[]", r"c.json: not a pytest-arbiter cache: it has no \"schema\" field")


def test_truncated_corpus_is_a_clear_error_and_stays_untouched(tmp_path: Path) -> None:
    path = tmp_path / "corpus.json"
    full = write(path, entry("a"), entry("b"))
    cut = full[: len(full) // 2]
    path.write_bytes(cut)
    with pytest.raises(ArtifactError,
                       match=r"corpus.json is not valid JSON: .* at line \d+, column \d+ "
                             r"\(byte \d+\)"):
        artifacts.read_cache(path)
    with pytest.raises(ArtifactError, match=r"corpus\.json is not valid JSON"):
        artifacts.update_cache(path, [entry("c")])
    assert path.read_bytes() == cut
    assert not list(tmp_path.glob(".corpus.json.*.tmp"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["d0", "d1"]), st.text(max_size=6),
                          st.lists(st.sampled_from("abcd"), min_size=1, max_size=3, unique=True),
                          st.floats(0, 1), st.floats(1e-3, 1e12), st.integers(1, 10**6),
                          st.booleans(), st.sampled_from(["h1", "h\u00e9", "\U0001f600"]),
                          st.sampled_from([None, T0, T1]),
                          st.dictionaries(st.sampled_from("ab"), st.text(max_size=3),
                                          max_size=2)), max_size=8))
def test_any_cache_round_trips_through_its_file(rows: list[Any]) -> None:
    """Whatever the entries hold, a write reads back as the same entries and writes the
    same bytes again (whole caches, keys in any order, shared rows or not)."""
    entries = [CacheEntry(
        device, "cpu", "op", bucket, "float32",
        tuple(RankedCandidate(n, LatencyStats(median, median, median, median, median, samples))
              for n in names), confidence, tie, reasons,
        {"host": host, "p_value": confidence, "shapes": [[samples, 2]]},
        {n: Considered(f"{n * 8}", "timed") for n in names},
        {"numpy": host}, since=since or NO_SINCE)
        for device, bucket, names, confidence, median, samples, tie, host, since, reasons
        in rows]
    cache = MeasureCache(entries)
    text = encode_document(cache)
    back = decode_document(text)
    assert back == cache.entries()
    assert encode_document(back) == text
    assert convert_document(json.loads(json.dumps(document_builtins(back)))) == back


def test_a_file_is_read_a_block_of_lines_at_a_time_with_the_same_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer's layout is decoded block by block (the file's bytes are never all in
    memory beside the entries); a bad entry in a later block is still named exactly."""
    from pytest_arbiter.store import cache_file

    built = [entry(f"b{i:03d}", host=f"h{i % 3}", fingerprints={"a": f"{i % 2}" * 16},
                   environment={"numpy": str(i % 4)}, since=T0 if i % 2 else NO_SINCE)
             for i in range(200)]
    path = tmp_path / "c.json"
    text = write(path, *built)
    monkeypatch.setattr(cache_file, "BLOCK", 1500)  # a few entries a block
    with path.open("rb") as file:
        streamed = cache_file._stream(file)
    assert streamed == sorted(built) == artifacts.read_cache(path).entries()
    bad = text.replace(b'"bucket":"b187","dtype":"float32","ranking":[{"name":"a","stats":'
                       b'{"median_ns":1000', b'"bucket":"b187","dtype":"float32","ranking":'
                       b'[{"name":"a","stats":{"median_ns":-1000')
    path.write_bytes(bad)
    with path.open("rb") as file:
        assert cache_file._stream(file) is None
    refused(tmp_path, bad.decode(), r"c.json: Expected `int` >= 0 - at "
                                    r"`\$.entries\[187\].ranking\[0\].stats.median_ns`")


# -- versions no release wrote ------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
def test_a_version_no_release_wrote_is_refused_by_name(tmp_path: Path, version: int) -> None:
    """Versions 1 and 2 of the cache were never released: the first release reads its own
    format only, and says which one."""
    refused(tmp_path, {"schema": "pytest-arbiter/cache", "version": version, "entries": []},
            f"c.json: cache version {version} is not read by this pytest-arbiter, which "
            "reads version 3")


# -- what the loaded cache costs ----------------------------------------------------------


@pytest.mark.slow
def test_a_loaded_cache_leaves_the_garbage_collector_almost_nothing(tmp_path: Path) -> None:
    """The structs are untracked (gc=False) and the tables shared: 20,000 entries add
    a few hundred tracked objects (the format before added 10 per entry)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_merge import make_entries
    finally:
        sys.path.pop(0)
    path = tmp_path / "big.json"
    artifacts.write_cache(path, MeasureCache(make_entries(20_000, seed=1, host="r")))
    gc.collect()
    before = len(gc.get_objects())
    cache = artifacts.read_cache(path)
    tracked = len(gc.get_objects()) - before
    assert len(cache) == 20_000 and tracked < 1000, tracked
    assert not gc.is_tracked(cache.entries()[0]) and not gc.is_tracked(cache.entries()[0].ranking)


def test_two_reads_of_one_file_share_their_tables_and_compare_by_identity(
        tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write(path, *(entry(f"b{i}", host=f"h{i % 3}", fingerprints={"a": "f" * 16},
                        environment={"numpy": "2"}, since=T0) for i in range(50)))
    first, second = artifacts.read_cache(path).entries(), artifacts.read_cache(path).entries()
    assert all(a.environment is b.environment and a.considered is b.considered
               and a.provenance.run is b.provenance.run  # type: ignore[union-attr]
               for a, b in zip(first, second, strict=True))
    result = merge(first, second)
    assert len(result.entries) == 50 and not result.conflicts


def test_loaded_entries_copy_pickle_and_replace(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    write(path, entry("a", fingerprints={"a": "f"}, environment={"x": "y"}, since=T0))
    loaded = artifacts.read_cache(path).entries()[0]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(loaded, protocol)) == loaded
    assert copy.deepcopy(loaded) == loaded == copy.copy(loaded)
    tied = msgspec.structs.replace(loaded, tie=True)
    assert tied.tie and not loaded.tie and tied.considered is loaded.considered
    with pytest.raises(TypeError):
        loaded.considered["b"] = Considered("g", "timed")  # type: ignore[index]
    with pytest.raises(AttributeError):
        loaded.tie = True  # type: ignore[misc]


def test_the_provenance_is_typed_fields_and_plain_json() -> None:
    prov = entry().provenance
    assert isinstance(prov, Provenance)
    assert prov.host == "h1" and prov.device_name == "Test Device" and prov.rounds == 25
    assert not prov.p_value and not prov.spent_ns  # unset: UNSET, which is falsy
    assert prov.shape_lists == [[32, 32], [32, 16]]
    with pytest.raises(ValueError, match="unknown provenance keys"):
        Provenance.of({"hots": "h1"})
    assert entry().to_dict()["provenance"] == {
        "device_name": "Test Device", "host": "h1", "measured_at": "2026-12-03T06:00:00Z",
        "rounds": 25, "shapes": [[32, 32], [32, 16]], "timed_ns": 12345,
        "versions": {"pytest-arbiter": "0.1.0"}}


def test_show_json_form_keeps_its_keys_and_reads_back() -> None:
    built = entry(fingerprints={"a": "f" * 16}, environment={"numpy": "2"}, since=T0)
    data = built.to_dict()
    assert list(data)[:12] == ["device", "target", "op", "bucket", "dtype", "winner",
                               "ranking", "confidence", "tie", "low_confidence", "rejected",
                               "provenance"]
    assert data["ranking"][0] == {"name": "a", **stats(1000.0).to_dict(), "carried": False}
    assert data["considered"] == {"a": {"fingerprint": "f" * 16, "outcome": "timed"}}
    assert data["since"] == "2026-12-01T06:00:00Z" and data["environment"] == {"numpy": "2"}
    json.dumps(data, allow_nan=False)
    assert CacheEntry.from_dict(json.loads(json.dumps(data))) == built


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
    doc = document(entry(confidence=0.999))
    weaker = json.loads(json.dumps(doc["entries"][0]))
    weaker["confidence"] = 0.5
    weaker["ranking"].reverse()
    doc["entries"].insert(0, weaker)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
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


def test_a_measurement_of_changed_code_supersedes_a_stronger_one_of_the_old() -> None:
    """The issue's stale winner: ``a`` became 50x slower (its code changed, fingerprint
    A to B). Re-measured against B with confidence 0.992, it must replace the entry
    measured against A with 0.999, in any order; before, the old one won 10 of 10."""
    old = entry(winner="a", runner_up="b", confidence=0.999, samples=200,
                fingerprints={"a": "A" * 16, "b": "b" * 16}, since=T0)
    new = entry(winner="b", runner_up="a", confidence=0.992, samples=9, median=1000.0,
                fingerprints={"a": "B" * 16, "b": "b" * 16}, since=T1)
    assert prefer(old, new) is new and prefer(new, old) is new
    for parts in ([old], [new]), ([new], [old]), ([old], [new], [old]):
        result = merge(*parts)
        assert result.entries[old.key] is new and result.conflicts == []
    # against the same code and environment, the stronger measurement still wins
    again = entry(winner="b", runner_up="a", confidence=0.995, samples=9,
                  fingerprints={"a": "B" * 16, "b": "b" * 16}, since=T1, host="h2")
    assert prefer(new, again) is again and prefer(again, new) is again
    assert [c.other.winner for c in merge([new], [entry(
        winner="a", runner_up="b", confidence=0.9999, fingerprints=new.fingerprints(),
        since=T1, host="h3")]).conflicts] == ["b"]


def test_since_carries_forward_only_what_was_measured_against_the_same_basis() -> None:
    fps = {"a": Considered("A" * 16, "timed"), "b": Considered("b" * 16, "rejected", "x")}
    env = {"numpy": "2.4.6"}
    old = CacheEntry("d", "cpu", "matmul", "k", "float32", (RankedCandidate("a", stats(1)),),
                     considered=fps, environment=env, since=T0)
    same = {"a": Considered("A" * 16, "timed"), "b": Considered("b" * 16, "timed")}
    assert since_for(old, same, env, T1) == T0  # an outcome is not the code
    assert since_for(old, {**same, "c": Considered("c" * 16, "timed")}, env, T1) == T1
    assert since_for(old, {"a": same["a"]}, env, T1) == T1  # a candidate removed
    assert since_for(old, {**same, "a": Considered("Z" * 16, "timed")}, env, T1) == T1
    assert since_for(old, same, {"numpy": "2.5.0"}, T1) == T1
    assert since_for(None, same, env, T1) == T1
    legacy = CacheEntry("d", "cpu", "matmul", "k", "float32", (RankedCandidate("a", stats(1)),),
                        considered=fps, environment=env)
    assert since_for(legacy, same, env, T1) == T1


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
    # different winners measured against different code: a change, not a conflict
    changed = entry(winner="b", runner_up="a", fingerprints={"a": "2" * 16}, since=T1)
    assert merge([a], [changed]).conflicts == []


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
    lambda bucket, names, samples, spread, conf, tie, host, code, since: entry(
        bucket, names[0], confidence=conf, samples=samples, spread=spread, tie=tie,
        host=host, runner_up=names[1] if len(names) > 1 else None,
        fingerprints={n: code * 16 for n in names} if code else None, since=since,
        environment={"numpy": "2"} if code == "1" else None),
    st.sampled_from(("b1", "b2", "b3")),
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=2, unique=True),
    st.sampled_from((1, 25)), st.sampled_from((0.0, 0.1)),
    st.sampled_from((0.5, 0.99, 1.0)), st.booleans(), st.sampled_from(("h1", "h2")),
    st.sampled_from(("", "1", "2")), st.sampled_from((NO_SINCE, T0, T1)))
caches_st = st.lists(entries_st, max_size=6).map(lambda es: merge(es).entries)


def _same(x: dict[tuple[str, ...], CacheEntry], y: dict[tuple[str, ...], CacheEntry]) -> None:
    assert x == y
    assert encode_document(x.values()) == encode_document(y.values())


@settings(max_examples=150, deadline=None)
@given(caches_st, caches_st, caches_st)
@pytest.mark.slow
def test_merge_is_commutative_associative_idempotent(a: dict, b: dict, c: dict) -> None:  # type: ignore[type-arg]
    """With entries measured against different fingerprints, environments and since."""
    ab = merge(a, b)
    _same(ab.entries, merge(b, a).entries)
    assert ab.conflicts == merge(b, a).conflicts
    _same(merge(ab.entries, c).entries, merge(a, merge(b, c).entries).entries)
    _same(merge(a, a).entries, a)
    _same(merge(a).entries, a)


def _loaded(entries: dict) -> MeasureCache:  # type: ignore[type-arg]
    """The cache as read back from its file."""
    return MeasureCache(decode_document(encode_document(entries.values())))


@settings(max_examples=100, deadline=None)
@given(caches_st, caches_st, caches_st)
def test_merging_caches_and_loaded_caches_is_the_same_merge(a: dict, b: dict, c: dict  # type: ignore[type-arg]
                                                            ) -> None:
    want = merge(a, b, c)
    for parts in ((MeasureCache(a.values()), MeasureCache(b.values()), MeasureCache(c.values())),
                  (_loaded(a), _loaded(b), _loaded(c)), (a, _loaded(b), MeasureCache(c.values()))):
        got = merge(*parts)
        _same(got.entries, want.entries)
        assert got.conflicts == want.conflicts


# -- atomic writes, the lock, symbolic links ----------------------------------------------

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pytest_arbiter.store import artifacts
    from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
    from pytest_arbiter.timing.measure import LatencyStats

    path, worker, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    stats = LatencyStats(10.0, 9.0, 9.5, 10.5, 12.0, 5)
    while not go.exists():
        time.sleep(0.002)
    for r in range(rounds):
        e = CacheEntry("dev", "cpu", "matmul", f"w{worker}-r{r}", "float32",
                       (RankedCandidate("k", stats),), 1.0, False, {}, {"host": f"w{worker}"})
        artifacts.update_cache(path, [e])
""")


@pytest.mark.slow
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
    from pytest_arbiter.store import artifacts
    from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
    from pytest_arbiter.timing.measure import LatencyStats

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
        code = ("import sys; from pytest_arbiter.store import artifacts\n"
                "from pytest_arbiter.errors import ArtifactError\n"
                "try:\n    artifacts.update_cache(sys.argv[1], [], timeout=0.2)\n"
                "except ArtifactError as e:\n    print(e); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "cache.json.lock stayed locked for 0.2 s" in proc.stdout
    assert path.read_bytes() == before


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links")
def test_a_symlinked_cache_is_locked_and_written_at_its_target(tmp_path: Path) -> None:
    """Before, the atomic replace turned the link into a regular file (the target kept
    the old entries: the corpus forked) and the lock sat beside the link."""
    real = tmp_path / "store" / "corpus.json"
    real.parent.mkdir()
    write(real, entry("old"))
    link = tmp_path / "work" / "cache.json"
    link.parent.mkdir()
    link.symlink_to(os.path.relpath(real, link.parent))
    chained = tmp_path / "chained.json"
    chained.symlink_to(link)
    assert artifacts.lock_path(link) == artifacts.lock_path(chained) == \
        real.with_name("corpus.json.lock")
    artifacts.update_cache(link, [entry("new")])
    artifacts.write_cache(chained, MeasureCache([*artifacts.read_cache(real), entry("third")]))
    assert link.is_symlink() and chained.is_symlink()
    assert {e.bucket for e in artifacts.read_cache(real)} == {"old", "new", "third"}
    assert sorted(p.name for p in link.parent.iterdir()) == ["cache.json"]
    assert not list(real.parent.glob(".corpus.json.*.tmp"))
    # a link to nothing: an error, never a file made wherever it points
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "store" / "new.json")
    with pytest.raises(ArtifactError, match="which does not exist"):
        artifacts.update_cache(dangling, [entry("x")])
    assert dangling.is_symlink() and not (tmp_path / "store" / "new.json").exists()


def test_write_error_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"no/such/c\.json"):
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
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats

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
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import MeasureCache

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


def test_a_whole_latency_past_an_int64_is_written_as_the_float_it_is(tmp_path: Path) -> None:
    """A whole latency is written as an integer, except past 2**63 - 1, where the reader
    would refuse the integer: an entry that was accepted when built must read back."""
    big = LatencyStats(1000.0, 900.0, 950.0, 1050.0, 1e19, 5)
    built = CacheEntry("d", "cpu", "matmul", "b", "float32", (RankedCandidate("k", big),))
    assert built.ranking[0].stats.max_ns == 1e19 and built.ranking[0].stats.min_ns == 900
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([built]))
    assert artifacts.read_cache(path).entries() == [built]


def test_update_cache_spares_the_read_of_a_file_unchanged_since_it_was_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuning run read the corpus at its start: while the file is the one it read
    (same stamp under the lock), its write does not read it again; once another writer
    replaced it, it does, and keeps that writer's entries."""
    path = tmp_path / "c.json"
    write(path, entry("a"), entry("b"))
    read, stamp = artifacts.read_cache_stamped(path)
    assert stamp is not None and stamp == artifacts.stamp_of(path)
    reads: list[object] = []
    real_read = artifacts.read_cache
    monkeypatch.setattr(artifacts, "read_cache",
                        lambda p: reads.append(p) or real_read(p))  # type: ignore[func-returns-value]
    artifacts.update_cache(path, [entry("c")], known=(stamp, read))
    assert reads == [] and {e.bucket for e in real_read(path)} == {"a", "b", "c"}
    # the write replaced the file: the old stamp no longer stands for it
    artifacts.update_cache(path, [entry("d")], known=(stamp, read))
    assert reads == [path] and {e.bucket for e in real_read(path)} == {"a", "b", "c", "d"}
    assert artifacts.stamp_of(tmp_path / "missing.json") is None
