"""The write of a tune's few keys beside a big corpus (``store/cache_splice``): the
unchanged entries' lines copied, the file the full merge's, byte for byte where the
table rows allow; anything else (a file changed since it was read, another layout)
written whole as before; a corrupt entry still named when the file is read."""

from __future__ import annotations

import datetime
import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, MeasureCache, plain_key
from pytest_arbiter.store.cache_file import encode_document
from pytest_arbiter.store.corpus import merge
from tests.factories import cache_entry

LATER = datetime.datetime(2021, 1, 1, tzinfo=datetime.timezone.utc)


def corpus(path: Path, count: int = 60) -> list[CacheEntry]:
    entries = [cache_entry(f"b{i:03d}", since=datetime.datetime(2020, 1, 1,
                                                                tzinfo=datetime.timezone.utc))
               for i in range(0, 2 * count, 2)]
    path.write_bytes(encode_document(entries))
    return entries


def full_merge(path_bytes: bytes, measured: list[CacheEntry], tmp: Path) -> bytes:
    """What the full merge writes: the old file read again, merged, written whole."""
    old = tmp / "full.json"
    old.write_bytes(path_bytes)
    artifacts.update_cache(old, measured, measured_now=True)
    return old.read_bytes()


def no_full_write(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: Any) -> None:
        raise AssertionError("the full write ran")

    monkeypatch.setattr(artifacts, "_write_entries", refuse)


def tune(path: Path, measured: list[CacheEntry], as_read: artifacts.AsRead | None
         ) -> None:
    artifacts.update_cache(path, measured, known=as_read, measured_now=True)


def lines(data: bytes) -> dict[tuple[str, ...], bytes]:
    """Each entry's line by key, less the comma after it (a file in the writer's
    layout)."""
    found = {}
    for text in data.split(b"\n"):
        if text.startswith(b'    {"device":'):
            line = text.removesuffix(b",")
            entry = json.loads(line)
            found[tuple(entry[k] for k in ("device", "target", "op", "bucket", "dtype"))] = line
    return found


@pytest.mark.parametrize("buckets", [["a", "b001", "b050!", "b057", "z"],  # all over
                                     ["b101", "b110!", "b117"],  # near the end only
                                     ["b000!"], ["b118!"], ["b119"]])
def test_the_spliced_write_is_the_full_write_when_no_table_row_is_new(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, buckets: list[str]) -> None:
    """New keys first, between two lines, last, and replaced keys (``!``): the same
    bytes as reading the file again, merging and writing it whole."""
    path = tmp_path / "c.json"
    corpus(path)
    before = path.read_bytes()
    measured = [cache_entry(b.rstrip("!"), since=LATER if b.endswith("!") else
                            datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc))
                for b in buckets]
    expected = full_merge(before, measured, tmp_path)
    _, as_read = artifacts.read_cache_as_read(path)
    assert as_read is not None and as_read.layout is not None
    no_full_write(monkeypatch)
    tune(path, measured, as_read)
    assert path.read_bytes() == expected


@pytest.mark.parametrize("kernel", ["copies", "cannot copy", "copies in pieces"])
def test_the_unchanged_lines_are_copied_file_to_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    """The old lines are not read into the process and written back: they go from file
    to file in the kernel (``os.copy_file_range``), or, where the system cannot do that,
    a block at a time; the bytes are the full write's either way, and the old file is
    closed afterwards."""
    import errno
    import os

    from pytest_arbiter.store import cache_splice

    path = tmp_path / "c.json"
    corpus(path)
    measured = [cache_entry("b050", since=LATER), cache_entry("z")]
    expected = full_merge(path.read_bytes(), measured, tmp_path)
    _, as_read = artifacts.read_cache_as_read(path)
    copied: list[int] = []
    real = os.copy_file_range

    def copy(src: int, dst: int, count: int, offset_src: int | None = None) -> int:
        if kernel == "cannot copy":
            raise OSError(errno.EXDEV, "not between these files")
        done = real(src, dst, min(count, 1000) if kernel == "copies in pieces" else count,
                    offset_src)
        copied.append(done)
        return done

    monkeypatch.setattr(os, "copy_file_range", copy)
    opened: list[Any] = []
    real_close = cache_splice.close_sources
    monkeypatch.setattr(artifacts, "close_sources",
                        lambda pieces: (opened.extend(p.source for p in pieces if isinstance(
                            p, cache_splice.FileRange)), real_close(pieces)))
    no_full_write(monkeypatch)
    tune(path, measured, as_read)
    assert path.read_bytes() == expected
    assert opened and all(f.closed for f in opened)
    assert (sum(copied) > len(expected) // 2) is (kernel != "cannot copy")


def test_a_splice_that_replaces_every_line_closes_the_old_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is copied from the old file when each of its lines is replaced: it is
    closed at once (an open file left to the collector is a ResourceWarning)."""
    import gc

    path = tmp_path / "c.json"
    (only,) = corpus(path, count=1)
    measured = [cache_entry(only.bucket, since=LATER)]
    expected = full_merge(path.read_bytes(), measured, tmp_path)
    _, as_read = artifacts.read_cache_as_read(path)
    no_full_write(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        tune(path, measured, as_read)
        gc.collect()
    assert path.read_bytes() == expected


def test_the_spliced_write_with_new_rows_reads_back_to_the_full_merge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Entries of another host and environment add table rows, after the old ones: the
    file reads back to the full merge's entries, every unchanged entry's line is the
    old line byte for byte, and the bytes depend only on the old file and the entries."""
    path = tmp_path / "c.json"
    old_entries = corpus(path)
    before = path.read_bytes()
    measured = [cache_entry("b003", host="a9", environment={"gpu_clock": "1"}),
                cache_entry("b040", host="a9", since=LATER), cache_entry("c", host="h8")]
    expected = full_merge(before, measured, tmp_path)
    _, as_read = artifacts.read_cache_as_read(path)
    no_full_write(monkeypatch)
    tune(path, measured, as_read)
    after = path.read_bytes()
    assert artifacts.read_entries(path) == artifacts.read_entries(tmp_path / "full.json")
    assert after != expected  # host a9's run row comes last, not first
    old_lines, new_lines = lines(before), lines(after)
    changed = {plain_key(e) for e in measured}
    for entry in old_entries:
        if plain_key(entry) not in changed:
            assert new_lines[plain_key(entry)] == old_lines[plain_key(entry)]
    again = tmp_path / "again.json"
    again.write_bytes(before)
    _, as_read = artifacts.read_cache_as_read(again)
    tune(again, measured, as_read)
    assert again.read_bytes() == after


def test_a_file_changed_between_read_and_write_gets_the_full_merge(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another writer replaced the file after the run read it: the write reads it again,
    merges and writes it whole, and loses neither writer's entries."""
    path = tmp_path / "c.json"
    corpus(path)
    _, as_read = artifacts.read_cache_as_read(path)
    artifacts.update_cache(path, [cache_entry("other", host="h7")])
    between = path.read_bytes()
    measured = [cache_entry("mine")]
    expected = full_merge(between, measured, tmp_path)
    spliced: list[object] = []
    real = artifacts.spliced
    monkeypatch.setattr(artifacts, "spliced", lambda *a: spliced.append(a) or real(*a))
    tune(path, measured, as_read)
    assert spliced == [] and path.read_bytes() == expected
    assert {"other", "mine", "b000", "b118"} <= {e.bucket for e in artifacts.read_entries(path)}


def test_the_file_replaced_in_place_after_the_stamp_check_is_written_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The open file is checked against the stamp too: a file changed in place after
    the check under the lock (here an unchanged entry's line, which a splice would copy)
    is not spliced: the full merge of what the run read is written."""
    import os

    path = tmp_path / "c.json"
    corpus(path)
    before = path.read_bytes()
    _, as_read = artifacts.read_cache_as_read(path)
    real = artifacts.stamp_of

    def checked_then_changed(where: Any) -> Any:
        found = real(where)
        with open(path, "r+b") as file:  # the same inode, one line's bytes changed
            file.write(before.replace(b'"timed_ns":12345', b'"timed_ns":54321', 1))
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        return found

    monkeypatch.setattr(artifacts, "stamp_of", checked_then_changed)
    tune(path, [cache_entry("mine")], as_read)
    monkeypatch.undo()
    after = path.read_bytes()
    assert b"54321" not in after
    assert after == full_merge(before, [cache_entry("mine")], tmp_path)


def test_a_generator_of_measured_entries_is_not_lost(tmp_path: Path) -> None:
    """The merge and the splice both read the measured entries: a generator is read once
    and kept, so the entries it held are in the file."""
    path = tmp_path / "c.json"
    corpus(path)
    _, as_read = artifacts.read_cache_as_read(path)
    artifacts.update_cache(path, (e for e in [cache_entry("b001")]), known=as_read,
                           measured_now=True)
    assert "b001" in {e.bucket for e in artifacts.read_entries(path)}


@pytest.mark.parametrize("layout", ["plain json", "an entry over two lines"])
def test_a_file_in_another_layout_gets_the_full_write(tmp_path: Path, layout: str) -> None:
    path = tmp_path / "c.json"
    corpus(path)
    data = path.read_bytes()
    if layout == "plain json":
        data = json.dumps(json.loads(data)).encode()
    else:
        data = data.replace(b'"bucket":"b010",', b'"bucket":"b010",\n    ', 1)
    path.write_bytes(data)
    measured = [cache_entry("b011"), cache_entry("b010", since=LATER)]
    expected = full_merge(data, measured, tmp_path)
    _, as_read = artifacts.read_cache_as_read(path)
    assert as_read is not None
    assert as_read.layout is None  # not one entry a line: read whole, written whole
    tune(path, measured, as_read)
    assert path.read_bytes() == expected


def test_a_corrupt_entry_is_named_when_it_is_first_needed(tmp_path: Path) -> None:
    """The file is read lazily: a bad value deep in a big corpus is an error naming the
    file and its JSON path when its key is first looked up, or when every entry is
    walked; the other keys read as before."""
    path = tmp_path / "c.json"
    corpus(path)
    data = path.read_bytes().split(b"\n")
    bad = next(i for i, line in enumerate(data) if b'"bucket":"b084"' in line)
    data[bad] = data[bad].replace(b'"confidence":0.999', b'"confidence":7', 1)
    path.write_bytes(b"\n".join(data))
    where = r"c\.json: .*\$\.entries\[42\]\.confidence"
    cache, as_read = artifacts.read_cache_as_read(path)
    assert as_read is not None and len(cache) == 60
    key = ("dev0", "cpu", "matmul", "b084", "float32")
    assert cache.get(("dev0", "cpu", "matmul", "b082", "float32")) is not None
    with pytest.raises(ArtifactError, match=where):
        cache.get(key)
    with pytest.raises(ArtifactError, match=where):
        cache.entries()
    stamped, _ = artifacts.read_cache_stamped(path)
    with pytest.raises(ArtifactError, match=where):
        stamped.by_key()
    with pytest.raises(ArtifactError, match=where):
        artifacts.read_cache(path)


def test_nothing_measured_that_changes_a_key_leaves_the_bytes_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.json"
    entries = corpus(path)
    before = path.read_bytes()
    cache, as_read = artifacts.read_cache_as_read(path)
    assert len(cache) == len(entries) and isinstance(cache, MeasureCache)
    no_full_write(monkeypatch)
    artifacts.update_cache(path, [entries[5]], known=as_read)
    assert path.read_bytes() == before
    assert merge(cache).entries == artifacts.read_cache(path).by_key()
