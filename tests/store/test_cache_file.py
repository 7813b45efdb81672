"""The cache file (schema ``pytest-arbiter/cache``, version 3): written byte-identical
on a round trip, its documented example read back, and every bad value refused naming the
file and its JSON path (the merge: test_corpus.py; atomic writes: test_artifacts.py)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    RankedCandidate,
)
from pytest_arbiter.store.cache_file import (
    convert_document,
    decode_document,
    document_builtins,
    encode_document,
)
from pytest_arbiter.timing.measure import LatencyStats
from tests.factories import FAST, ROOT, T0, T1, UTC, cache_bytes, cache_document, cache_entry, stats


def refused(tmp_path: Path, doc: Any, match: str) -> None:
    path = tmp_path / "c.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ArtifactError, match=match):
        artifacts.read_cache(path)


# -- the format ---------------------------------------------------------------------------


def test_write_read_write_is_byte_identical(tmp_path: Path, registry: CandidateRegistry
                                           ) -> None:
    cache = MeasureCache([cache_entry("b1"), cache_entry("b2", "b", host="h2", confidence=0.5)])
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
    text = encode_document([cache_entry("z", environment=env, fingerprints=fps, since=T0),
                            cache_entry("a", environment=env, fingerprints=fps, since=T0),
                            cache_entry("m", host="h2")]).decode()
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
        "median_ns": 1000, "min_ns": 900, "q1_ns": 950, "q3_ns": 1050, "max_ns": 1200,
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
    text = cache_bytes(tmp_path / "c.json", built)
    assert b'"median_ns":1181,"min_ns":0.25' in text and b'"max_ns":2000000000000,' in text
    assert b'"confidence":1.0' in text and b'"since":"2026-01-01T06:00:00Z"' in text
    assert cache_bytes(tmp_path / "again.json", *artifacts.read_cache(tmp_path / "c.json")) == text


def test_the_documented_example_reads_and_writes_back_byte_identical(tmp_path: Path) -> None:
    doc = ROOT / "docs" / "artifacts.md"
    example = doc.read_text().split("```json\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.json"
    path.write_text(example)
    cache = artifacts.read_cache(path)
    assert [e.winner for e in cache.entries()] == ["dot_matmul", "inplace_softmax"]
    assert cache_bytes(tmp_path / "again.json", *cache.entries()).decode() == example


def test_newer_schema_version_is_refused_naming_both(tmp_path: Path) -> None:
    doc = cache_document(cache_entry())
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
    doc = cache_document(cache_entry("a", fingerprints={"a": "f" * 16}, environment={"numpy": "2"},
                         since=T0), cache_entry("b"))
    mutate(doc)
    refused(tmp_path, doc, f"c.json: {message}")


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1e309"])
@pytest.mark.parametrize("where", ["entries.0.ranking.0.stats.max_ns",
                                   "entries.0.provenance.p_value", "entries.0.confidence"])
def test_a_number_out_of_a_doubles_range_is_refused(tmp_path: Path, number: str,
                                                    where: str) -> None:
    """``1e400`` reads as infinity: it was accepted, then broke ``show --json``, merges
    and every later write."""
    doc = cache_document(cache_entry("a", since=T0), cache_entry("b"))
    _at(where, 12345.0)(doc)
    text = json.dumps(doc).replace("12345.0", number)
    refused(tmp_path, text, r"c.json: .*(out of range|>=|<=).*" + where.split(".")[-1])


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_literals_are_refused(tmp_path: Path, literal: str) -> None:
    text = encode_document([cache_entry()]).decode().replace('"confidence":0.999',
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
    built = cache_entry("a", fingerprints={"a": "f" * 16}, environment={"numpy": "2"}, since=T0)
    doc = cache_document(built)
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
    full = cache_bytes(path, cache_entry("a"), cache_entry("b"))
    cut = full[: len(full) // 2]
    path.write_bytes(cut)
    with pytest.raises(ArtifactError,
                       match=r"corpus.json is not valid JSON: .* at line \d+, column \d+ "
                             r"\(byte \d+\)"):
        artifacts.read_cache(path)
    with pytest.raises(ArtifactError, match=r"corpus\.json is not valid JSON"):
        artifacts.update_cache(path, [cache_entry("c")])
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

    built = [cache_entry(f"b{i:03d}", host=f"h{i % 3}", fingerprints={"a": f"{i % 2}" * 16},
                   environment={"numpy": str(i % 4)}, since=T0 if i % 2 else NO_SINCE)
             for i in range(200)]
    path = tmp_path / "c.json"
    text = cache_bytes(path, *built)
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


def test_a_whole_latency_past_an_int64_is_written_as_the_float_it_is(tmp_path: Path) -> None:
    """A whole latency is written as an integer, except past 2**63 - 1, where the reader
    would refuse the integer: an entry that was accepted when built must read back."""
    big = LatencyStats(1000.0, 900.0, 950.0, 1050.0, 1e19, 5)
    built = CacheEntry("d", "cpu", "matmul", "b", "float32", (RankedCandidate("k", big),))
    assert built.ranking[0].stats.max_ns == 1e19 and built.ranking[0].stats.min_ns == 900
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([built]))
    assert artifacts.read_cache(path).entries() == [built]


@pytest.mark.parametrize("field, value, message", [
    ("q1_ns", 5000, "latencies must satisfy"),
    ("min_ns", 2000, "latencies must satisfy"),
    ("samples", 10**40, "samples"),
])
def test_an_impossible_row_is_refused_naming_the_file_and_the_entry(
        tmp_path: Path, field: str, value: int, message: str) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, artifacts.MeasureCache([cache_entry()]))
    doc = json.loads(path.read_text())
    doc["entries"][0]["ranking"][0]["stats"][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=message) as raised:
        artifacts.read_cache(path)
    assert "c.json" in str(raised.value) and "entries[0]" in str(raised.value)


def test_all_zero_latencies_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, artifacts.MeasureCache([cache_entry()]))
    doc = json.loads(path.read_text())
    for row in doc["entries"][0]["ranking"]:
        row["stats"].update(median_ns=0, min_ns=0, q1_ns=0, q3_ns=0, max_ns=0)
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="not all be zero"):
        artifacts.read_cache(path)


def test_a_since_in_the_future_is_refused_naming_the_entry(tmp_path: Path) -> None:
    import datetime

    ahead = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=2)
    with pytest.raises(ValueError, match="is in the future"):
        cache_entry(since=ahead)
    path = tmp_path / "c.json"
    artifacts.write_cache(path, artifacts.MeasureCache([cache_entry(since=T1)]))
    doc = json.loads(path.read_text())
    doc["entries"][0]["since"] = ahead.strftime("%Y-%m-%dT%H:%M:%SZ")
    path.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match="clock ahead") as raised:
        artifacts.read_cache(path)
    assert "c.json" in str(raised.value) and "entries[0]" in str(raised.value)
