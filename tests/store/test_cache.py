"""The loaded cache (``MeasureCache``): what it costs the garbage collector, shared
tables, copies and pickles, the typed provenance, the ``show --json`` form, and which of
its entries a lookup may use."""

from __future__ import annotations

import copy
import gc
import json
import pickle
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest

from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.decision.tuning import measured_arbitrate
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import (
    CacheEntry,
    Considered,
    MeasureCache,
    Provenance,
    RankedCandidate,
)
from pytest_arbiter.store.corpus import merge
from tests.factories import FAST, ROOT, T0, cache_bytes, cache_document, cache_entry, stats


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
    cache_bytes(path, *(cache_entry(f"b{i}", host=f"h{i % 3}", fingerprints={"a": "f" * 16},
                        environment={"numpy": "2"}, since=T0) for i in range(50)))
    first, second = artifacts.read_cache(path).entries(), artifacts.read_cache(path).entries()
    assert all(a.environment is b.environment and a.considered is b.considered
               and a.provenance.run is b.provenance.run  # type: ignore[union-attr]
               for a, b in zip(first, second, strict=True))
    result = merge(first, second)
    assert len(result.entries) == 50 and not result.conflicts


def test_loaded_entries_copy_pickle_and_replace(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cache_bytes(path, cache_entry("a", fingerprints={"a": "f"}, environment={"x": "y"}, since=T0))
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
    prov = cache_entry().provenance
    assert isinstance(prov, Provenance)
    assert prov.host == "h1" and prov.device_name == "Test Device" and prov.rounds == 25
    assert not prov.p_value and not prov.spent_ns  # unset: UNSET, which is falsy
    assert prov.shape_lists == [[32, 32], [32, 16]]
    with pytest.raises(ValueError, match="unknown provenance keys"):
        Provenance.of({"hots": "h1"})
    assert cache_entry().to_dict()["provenance"] == {
        "device_name": "Test Device", "host": "h1", "measured_at": "2026-12-03T06:00:00Z",
        "rounds": 25, "shapes": [[32, 32], [32, 16]], "timed_ns": 12345,
        "versions": {"pytest-arbiter": "0.1.0"}}


def test_show_json_form_keeps_its_keys_and_reads_back() -> None:
    built = cache_entry(fingerprints={"a": "f" * 16}, environment={"numpy": "2"}, since=T0)
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
    doc = cache_document(cache_entry(confidence=0.999))
    weaker = json.loads(json.dumps(doc["entries"][0]))
    weaker["confidence"] = 0.5
    weaker["ranking"].reverse()
    doc["entries"].insert(0, weaker)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    assert artifacts.read_cache(path).entries()[0].winner == "a"


def test_a_lazily_read_cache_decodes_only_the_keys_looked_up(tmp_path: Path) -> None:
    """A run's read of a file in the writer's layout decodes an entry when its key is
    first looked up: the same entries and answers as the whole read, one object per
    entry for the cache and its copy, and a walk decodes the rest."""
    path = tmp_path / "c.json"
    written = [cache_entry(f"b{i:02d}", device=f"d{i % 2}") for i in range(30)]
    cache_bytes(path, *written)
    cache, as_read = artifacts.read_cache_as_read(path)
    assert as_read is not None and as_read.layout is not None
    lazy = cache._lazy
    assert lazy is not None and len(cache) == 30 and not lazy._decoded
    key = ("d1", "cpu", "matmul", "b03", "float32")
    assert key in cache and ("d0", *key[1:]) not in cache and cache.devices() == {"d0", "d1"}
    copied = cache.copy()
    assert cache.get(key) == written[3] and copied.get(key) is cache.get(key)
    assert list(lazy._decoded) == [key]
    new = cache_entry("b99")
    cache.put(new)
    assert len(cache) == 31 and len(copied) == 30 and copied.get(new.key) is None
    assert cache.changes() == {new.key: None}
    assert cache.entries() == sorted([*written, new]) and cache._lazy is None
    assert copied.by_key() == artifacts.read_cache(path).by_key()


def _lazy_cache(data: bytes) -> MeasureCache:
    from pytest_arbiter.store.cache_file import lazy_entries

    found = lazy_entries(data, "c.json", lambda entries: merge(entries).entries)
    assert found is not None
    return MeasureCache.of_lazy(found)


def test_a_lookup_while_another_thread_walks_the_cache_finds_the_entry() -> None:
    """A walk (``by_key``) moves the lazy entries into the decoded ones and drops the lazy
    part; a lookup in between must find the key in one or the other, never in neither."""
    import threading

    from pytest_arbiter.store.cache import plain_key
    from pytest_arbiter.store.cache_file import encode_document

    entries = [cache_entry(f"b{i:03d}") for i in range(50)]
    cache = _lazy_cache(encode_document(entries))

    class WalkWhileRead(dict):  # type: ignore[type-arg]
        def get(self, key: object, default: object = None) -> object:
            found = dict.get(self, key, default)
            walker = threading.Thread(target=cache.by_key)
            walker.start()
            walker.join()
            return found

    cache._entries = WalkWhileRead()
    assert cache.get(plain_key(entries[17])) == entries[17]


def test_a_failed_walk_leaves_nothing_behind_for_the_next_lookup() -> None:
    """A walk that stops at a damaged entry must not leave the entries it decoded before
    it to be checked again with the next lookup's: a sound entry is still found."""
    from pytest_arbiter.errors import ArtifactError
    from pytest_arbiter.store.cache import plain_key
    from pytest_arbiter.store.cache_file import encode_document

    entries = [cache_entry(f"b{i}") for i in range(4)]
    lines = encode_document(entries).split(b"\n")
    for i, line in enumerate(lines):
        if b'"bucket":"b1"' in line:  # out of order: found after the decode
            lines[i] = line.replace(b'"median_ns":1000', b'"median_ns":5000', 1)
        if b'"bucket":"b2"' in line:  # out of range: found by the decode
            lines[i] = line.replace(b'"confidence":', b'"confidence":7,"_x":', 1)
    cache = _lazy_cache(b"\n".join(lines))
    with pytest.raises(ArtifactError, match=r"entries\[2\]"):
        cache.by_key()
    assert cache.get(plain_key(entries[3])) == entries[3]
    with pytest.raises(ArtifactError, match=r"entries\[1\]"):
        cache.get(plain_key(entries[1]))


@pytest.mark.parametrize("rounds", [3, 50])
def test_low_confidence_and_timed_count_follow_their_rules_for_every_carried_pattern(
        rounds: int) -> None:
    """Low confidence needs two rows timed in the latest comparison (carried ones were
    not), whichever rows are carried; the timed count is the ``timed`` rows."""
    import itertools

    for size in range(1, 5):
        for carried in itertools.product([False, True], repeat=size):
            for tie, confidence in ((False, 0.5), (True, 0.5), (False, 0.999)):
                ranking = tuple(RankedCandidate(f"k{i}", stats(1000.0 + i), carried=c)
                                for i, c in enumerate(carried))
                outcomes = {f"k{i}": Considered("0" * 16, "rejected" if c else "timed")
                            for i, c in enumerate(carried)}
                entry = CacheEntry("d", "cpu", "matmul", "b", "float32", ranking,
                                   confidence, tie, {}, {"rounds": rounds}, outcomes)
                timed = carried.count(False)
                low = timed >= 2 and (rounds < 7 or (not tie and confidence < 0.99))
                assert entry.low_confidence is low, (carried, tie, confidence)
                assert entry.timed_count == timed
