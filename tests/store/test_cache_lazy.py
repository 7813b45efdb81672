"""A big corpus read lazily (``store/cache_lazy``): the read decodes every entry's key
once (a file not in the writer's layout, one entry a line in key order, is read whole,
with the same answers and errors), then a run's lookups and a tune's write of its few
keys decode the keys of a few dozen lines per key; an entry no lookup reads is kept as
it lies."""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.store import artifacts, cache_file, cache_lazy
from pytest_arbiter.store.cache import CacheEntry, plain_key
from pytest_arbiter.store.cache_file import encode_document
from tests.factories import cache_entry

OLD = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
LATER = datetime.datetime(2021, 1, 1, tzinfo=datetime.timezone.utc)
ENTRIES = 2000


def corpus(path: Path, count: int = ENTRIES) -> list[CacheEntry]:
    """``count`` entries of four devices, every other bucket (new keys fit between)."""
    entries = [cache_entry(f"b{i:05d}", device=f"dev{i // 2 % 4}", since=OLD)
               for i in range(0, 2 * count, 2)]
    path.write_bytes(encode_document(entries))
    return entries


class Counting:
    """A decoder that counts what it decodes."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls = real, 0

    def decode(self, data: Any) -> Any:
        self.calls += 1
        return self.real.decode(data)


def count_line_keys(monkeypatch: pytest.MonkeyPatch, *, no_whole_pass: bool = True
                    ) -> Counting:
    """Count the lines whose key is decoded; ``no_whole_pass``: fail on any decode of
    every entry's key or JSON."""
    counting = Counting(getattr(cache_lazy, "_KEY", None))
    monkeypatch.setattr(cache_lazy, "_KEY", counting, raising=False)
    if no_whole_pass:
        refuse, keys = Refusing(), cache_file._KEYS
        for module in (cache_lazy, cache_file):
            for name in ("_KEYS", "_RAWS", "_ALL"):
                monkeypatch.setattr(module, name, refuse, raising=False)
        # the read's one pass over every key (the file's order and count checked)
        monkeypatch.setattr(cache_file, "_KEYS", Once(keys))
        if hasattr(cache_lazy, "EntryLines"):  # an entry's place: counted for messages only
            monkeypatch.setattr(cache_lazy.EntryLines, "index", refuse.decode)
    return counting


class Once:
    """A decoder that may decode once: the read's pass over every key."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls = real, 0

    def decode(self, data: Any) -> Any:
        self.calls += 1
        if self.calls > 1:
            raise AssertionError("every key was decoded twice")
        return self.real.decode(data)


class Refusing:
    """A decoder (or a writer) that must not be called."""

    def decode(self, *_: Any) -> Any:
        raise AssertionError("every line was decoded, or the whole file written")


def per_key(count: int = ENTRIES) -> int:
    """The lines a search may read: two per halving, and the line after a found key."""
    return 2 * math.ceil(math.log2(count)) + 3


def test_a_tune_of_ten_keys_decodes_a_few_lines_per_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read (one pass over every key: their order and count checked), then the
    lookups of ten keys (five new, five in the file), the line count, the devices and
    the spliced write: no more than a search's lines per key, and no other pass over
    every line."""
    path = tmp_path / "c.json"
    entries = corpus(path)
    before = path.read_bytes()
    counting = count_line_keys(monkeypatch)
    cache, as_read = artifacts.read_cache_as_read(path)
    assert counting.calls == 0 and len(cache) == ENTRIES
    assert cache.devices() == {"dev0", "dev1", "dev2", "dev3"}
    looked = [entries[i].key for i in (0, 500, 1000, 1500, ENTRIES - 1)]
    new = [cache_entry(f"b{i:05d}", device="dev1") for i in (1, 999, 2001, 3999, 5000)]
    for key in looked:
        assert cache.get(key) == entries[[e.key for e in entries].index(key)]
    for entry in new:
        assert cache.get(entry.key) is None
    measured = [*new, *(cache_entry(k[3], device=k[0], since=LATER) for k in looked)]
    artifacts.update_cache(path, measured, known=as_read, measured_now=True)
    assert 0 < counting.calls <= (len(looked) + len(new) + 4) * per_key()
    monkeypatch.undo()
    after = artifacts.read_entries(path)
    assert len(after) == ENTRIES + len(new)
    assert {plain_key(e): e for e in after} == {
        **{plain_key(e): e for e in entries}, **{plain_key(e): e for e in measured}}
    kept = set(before.split(b"\n"))
    changed = {e.bucket for e in measured}
    for line in path.read_bytes().split(b"\n"):
        if line.startswith(b'    {"device"') and not any(
                f'"bucket":"{b}"'.encode() in line for b in changed):
            assert line in kept  # every other line byte for byte


def test_a_line_broken_beyond_reading_anywhere_is_refused_at_the_read(
        tmp_path: Path) -> None:
    """A line that is not JSON (a cut line, a conflict marker), however far from the
    keys a run looks up: the read refuses the file, naming the line and column, as a
    whole read does (a usage error before any test runs), and writes nothing."""
    path = tmp_path / "c.json"
    corpus(path)
    lines = path.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b'"bucket":"b02000"' in line)
    for broken in (lines[at].replace(b'"ranking":[', b'"ranking":[[', 1),
                   b"<<<<<<< HEAD\n" + lines[at]):
        damaged = [*lines[:at], broken, *lines[at + 1:]]
        path.write_bytes(b"\n".join(damaged))
        with pytest.raises(artifacts.ArtifactError,
                           match=rf"c\.json is not valid JSON: .* at line {at + 1}, column"):
            artifacts.read_cache_as_read(path)
        assert path.read_bytes() == b"\n".join(damaged)


@pytest.mark.parametrize("damage", ["swapped", "twice", "two lines"])
def test_a_line_out_of_the_layout_where_a_search_reads_gives_the_whole_answer(
        tmp_path: Path, damage: str) -> None:
    """Two lines out of key order, a key listed twice (a hand-resolved conflict), an
    entry over two lines, beside the key looked up: every lookup answers as the whole
    read does (a key listed twice: the entry the merge rule prefers), and the tune's
    write is the full merge."""
    path = tmp_path / "c.json"
    corpus(path, count=200)
    lines = path.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b'"bucket":"b00200"' in line)
    if damage == "swapped":
        lines[at], lines[at + 1] = lines[at + 1], lines[at]
    elif damage == "twice":
        weaker = lines[at].replace(b'"confidence":0.999', b'"confidence":0.5', 1)
        lines.insert(at, weaker)
    else:
        lines[at] = lines[at].replace(b'"bucket":"b00200",', b'"bucket":"b00200",\n    ', 1)
    path.write_bytes(b"\n".join(lines))
    whole = artifacts.read_cache(path).by_key()
    cache, as_read = artifacts.read_cache_as_read(path)
    for key in [("dev0", "cpu", "matmul", "b00200", "float32"),
                ("dev1", "cpu", "matmul", "b00202", "float32"),
                ("dev2", "cpu", "matmul", "b00204", "float32"),
                ("dev1", "cpu", "matmul", "b00201", "float32")]:
        assert cache.get(key) == whole.get(key), key
        assert (key in cache) is (key in whole)
    assert cache.devices() == {k[0] for k in whole} and cache.by_key() == whole
    measured = [cache_entry("b00201", device="dev1"),
                cache_entry("b00200", device="dev0", since=LATER)]
    full = tmp_path / "full.json"
    full.write_bytes(path.read_bytes())
    artifacts.update_cache(full, measured, measured_now=True)
    artifacts.update_cache(path, measured, known=as_read, measured_now=True)
    assert path.read_bytes() == full.read_bytes()


def test_the_devices_of_a_big_file_cost_a_search_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device tags of a lazily read file: the first line's, then a search past
    each device's keys; no pass over every line after the read's."""
    path = tmp_path / "c.json"
    corpus(path)
    counting = count_line_keys(monkeypatch)
    cache, _ = artifacts.read_cache_as_read(path)
    assert cache.devices() == {"dev0", "dev1", "dev2", "dev3"}
    assert counting.calls <= 5 * per_key()


ODD = ["a", "a b", "a!", "a\"q", "a\\b", "a\u00e9", "a\u2028", "b", "\u00ff", "z" * 40]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 40])
@pytest.mark.parametrize("seed", [1, 2])
def test_searches_answer_as_the_whole_read_for_any_keys(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, seed: int) -> None:
    """Keys that sort oddly as bytes (a space, a quote, a backslash, non-ASCII): every
    key in the file found, every key around them missed, the devices, and the splice of
    new and changed keys at any place the full merge's bytes."""
    import random

    rng = random.Random(seed * 100 + count)
    names = sorted({rng.choice(ODD) + rng.choice(ODD) for _ in range(3 * count)})
    chosen = sorted(rng.sample(names, min(count, len(names) - 1)))
    entries = [cache_entry(b, device=rng.choice(["d0", "d 1", "d\u00e9"]), since=OLD)
               for b in chosen]
    path = tmp_path / "c.json"
    path.write_bytes(encode_document(entries))
    whole = artifacts.read_cache(path).by_key()
    cache, as_read = artifacts.read_cache_as_read(path)
    assert len(cache) == len(whole) and cache.devices() == {k[0] for k in whole}
    for device in ("d0", "d 1", "d\u00e9", "d"):
        for name in names:
            key = (device, "cpu", "matmul", name, "float32")
            assert cache.get(key) == whole.get(key) and (key in cache) is (key in whole)
    measured = [cache_entry(name, device=rng.choice(["d0", "d 1", "d\u00e9"]), since=LATER)
                for name in rng.sample(names, min(4, len(names)))]
    full = tmp_path / "full.json"
    full.write_bytes(path.read_bytes())
    artifacts.update_cache(full, measured, measured_now=True)
    assert as_read is not None and as_read.layout is not None
    assert not as_read.layout.lines.broken  # every search stayed on the lines
    monkeypatch.setattr(artifacts, "_write_entries", Refusing().decode)
    artifacts.update_cache(path, measured, known=as_read, measured_now=True)
    assert path.read_bytes() == full.read_bytes()


def test_a_line_whose_key_cannot_be_read_is_refused_at_the_read(tmp_path: Path) -> None:
    """A line whose key is not five strings, however far from the keys a run looks up:
    the read refuses the file, naming the entry's JSON path, as a whole read does."""
    path = tmp_path / "c.json"
    corpus(path, count=200)
    lines = path.read_bytes().split(b"\n")
    at = next(i for i, line in enumerate(lines) if b'"bucket":"b00200"' in line)
    lines[at] = lines[at].replace(b'"device":"dev0"', b'"device":7', 1)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(artifacts.ArtifactError) as whole:
        artifacts.read_cache(path)
    assert "$.entries[" in str(whole.value)
    with pytest.raises(artifacts.ArtifactError) as lazy:
        artifacts.read_cache_as_read(path)
    assert str(lazy.value) == str(whole.value)


@pytest.mark.parametrize("other", ["b054", "b006"], ids=["neighbours", "far apart"])
def test_a_line_out_of_order_anywhere_is_found_and_written_once(
        tmp_path: Path, other: str) -> None:
    """Two lines swapped by hand (a hand-resolved conflict), where a lookup's search may
    read neither: the moved key is still found, and a tune of it writes one line for
    it, not a second."""
    path = tmp_path / "c.json"
    entries = [cache_entry(f"b{i:03d}", since=OLD) for i in range(0, 80, 2)]
    path.write_bytes(encode_document(entries))
    lines = path.read_bytes().split(b"\n")
    first, second = (next(i for i, line in enumerate(lines) if f'"bucket":"{b}"'.encode()
                          in line) for b in (other, "b056"))
    lines[first], lines[second] = lines[second], lines[first]  # each keeps its comma
    path.write_bytes(b"\n".join(lines))
    moved = next(e for e in entries if e.bucket == "b056")
    cache, as_read = artifacts.read_cache_as_read(path)
    assert cache.get(moved.key) == moved
    again = cache_entry("b056", since=LATER)
    artifacts.update_cache(path, [again], known=as_read, measured_now=True)
    assert path.read_bytes().count(b'"bucket":"b056"') == 1
    after = {plain_key(e): e for e in artifacts.read_entries(path)}
    assert after == {**{plain_key(e): e for e in entries}, plain_key(again): again}
