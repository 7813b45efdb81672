"""The streamed reads, diff and merge of cache files give what the whole-file reads give:
the same entries, the same diff, the same merged bytes and conflicts, the same errors;
files not in the writer's order are read whole."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from pytest_arbiter.cli.main import main
from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store import artifacts, cache_file, corpus_files
from pytest_arbiter.store.cache import CacheEntry, MeasureCache
from pytest_arbiter.store.cache_file import decode_document, encode_document, key_blocks
from pytest_arbiter.store.corpus import KeyChange, WinnerChange, diff
from pytest_arbiter.store.tables import _Tables
from tests.factories import T0, T1, cache_bytes, cache_entry


def corpus(n: int, start: int = 0, *, host: str = "h1", shift: int = 0) -> list[CacheEntry]:
    """``n`` entries of keys ``start`` .. over two devices, two environments, a run per
    host; ``shift`` makes some keys' winner another."""
    return [cache_entry(f"b{i:04d}", "b" if (i + shift) % 5 == 0 else "a",
                        runner_up="a" if (i + shift) % 5 == 0 else "b",
                        device=f"dev{i % 2}", host=host, since=T0,
                        fingerprints={"a": "0" * 16, "b": "1" * 16},
                        environment={"numpy": str(i % 2)}, confidence=0.999,
                        samples=20 + i % 7)
            for i in range(start, start + n)]


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few entries a block, so that every walk crosses many blocks."""
    monkeypatch.setattr(cache_file, "BLOCK", 2000)


def write(path: Path, entries: list[CacheEntry]) -> Path:
    cache_bytes(path, *entries)
    return path


def test_the_blocks_of_a_file_are_its_entries_decoded_whole(
        tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path / "c.json", corpus(300))
    with path.open("rb") as file:
        blocks = list(key_blocks(file))
    assert len(blocks) > 10
    assert [e for b in blocks for e in b] == decode_document(path.read_bytes())
    whole = artifacts.read_cache(path).entries()
    monkeypatch.setattr(artifacts, "read_cache", None)  # the blocks only
    assert artifacts.read_entries(path) == whole


def test_a_file_out_of_order_or_with_a_key_twice_is_read_whole(tmp_path: Path,
                                                               small_blocks: None) -> None:
    """A hand-edited file in the writer's layout: its keys out of order, or one key
    twice (a resolved git conflict)."""
    lines = encode_document(corpus(100)).split(b"\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(b'    {"device":'))
    head, rows, tail = lines[:first], lines[first:first + 100], lines[first + 100:]
    swapped = [*rows[50:-1], rows[-1] + b",", *rows[:49], rows[49].rstrip(b",")]
    for name, body in (("unordered", swapped), ("twice", [*rows[:60], rows[59], *rows[60:]])):
        path = tmp_path / f"{name}.json"
        path.write_bytes(b"\n".join(head + body + tail))
        with path.open("rb") as file, pytest.raises(cache_file.Unstreamable):
            list(key_blocks(file))
        assert artifacts.read_entries(path) == artifacts.read_cache(path).entries()
        assert len(artifacts.read_entries(path)) == 100
        with path.open("rb") as file:
            assert not cache_file.in_key_order(file)
        assert [e for b in artifacts.ordered_blocks(path) for e in b] == \
            artifacts.read_entries(path)


def test_show_json_writes_a_block_of_entries_at_a_time_keys_in_order_first(
        tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Output cannot be taken back: a file is shown block by block once its keys alone
    were found in order; entries are never all read into memory at once."""
    path = write(tmp_path / "c.json", corpus(200))
    whole = artifacts.read_cache(path).entries()
    with path.open("rb") as file:
        assert cache_file.in_key_order(file)
    sizes = [len(b) for b in artifacts.ordered_blocks(path)]
    assert len(sizes) > 10 and sum(sizes) == 200
    monkeypatch.setattr(artifacts, "read_cache", None)  # the blocks only
    out = io.StringIO()
    assert main(["show", "--json", str(path)], out=out) == 0
    assert json.loads(out.getvalue()) == [e.to_dict() for e in whole]


def test_a_bad_entry_in_a_late_block_is_named_as_the_whole_read_names_it(
        tmp_path: Path, small_blocks: None) -> None:
    path = write(tmp_path / "c.json", corpus(200))
    text = path.read_bytes()
    bad = text.replace(b'"bucket":"b0187","dtype":"float32","ranking":[{"name":"a","stats":'
                       b'{"median_ns":1000', b'"bucket":"b0187","dtype":"float32","ranking":'
                       b'[{"name":"a","stats":{"median_ns":-1000')
    assert bad != text
    path.write_bytes(bad)
    with pytest.raises(ArtifactError) as whole:
        artifacts.read_cache(path)
    assert ".ranking[0].stats.median_ns" in str(whole.value)
    for read in (artifacts.read_entries, lambda p: list(artifacts.ordered_blocks(p)),
                 lambda p: corpus_files.diff_files(p, p, str),
                 lambda p: corpus_files.merge_files(tmp_path / "out.json", [p])):
        with pytest.raises(ArtifactError) as streamed:
            read(path)
        assert str(streamed.value) == str(whole.value)
    assert not (tmp_path / "out.json").exists()


def described(change: WinnerChange | KeyChange) -> tuple[str, ...]:
    if isinstance(change, WinnerChange):
        return ("changed", *change.key, change.old.winner, change.new.winner)
    return ("added" if change.old is None else "removed", *change.entry.key)


@pytest.mark.parametrize("layout", ["writer", "compact"])
def test_the_streamed_diff_is_the_diff_of_the_loaded_caches(
        tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    old, new = corpus(150), corpus(150, start=90, host="h2", shift=1)
    paths = write(tmp_path / "old.json", old), write(tmp_path / "new.json", new)
    if layout == "compact":  # another layout: read whole
        for path in paths:
            path.write_text(json.dumps(json.loads(path.read_text())))
    want = diff(artifacts.read_cache(paths[0]), artifacts.read_cache(paths[1]))
    if layout == "writer":
        monkeypatch.setattr(corpus_files, "read_cache", None)  # the streamed walk only
    got = corpus_files.diff_files(*paths, described)
    assert got.changed == [described(c) for c in want.changed]
    assert got.added == [described(KeyChange(None, e)) for e in want.added]
    assert got.removed == [described(KeyChange(e, None)) for e in want.removed]
    assert got.same == want.same
    assert got.changed and got.added and got.removed and got.same


def merged_both_ways(tmp_path: Path, shards: list[Path], out_bytes: bytes | None = None
                     ) -> tuple[corpus_files.MergedFile, bytes, list[str], bytes]:
    """``merge_files`` into OUT, and the whole-file merge (update_cache of the loaded
    shards) into another OUT holding the same bytes."""
    streamed, loaded = tmp_path / "streamed.json", tmp_path / "loaded.json"
    for out in (streamed, loaded):
        out.unlink(missing_ok=True)
        if out_bytes is not None:
            out.write_bytes(out_bytes)
    result = corpus_files.merge_files(streamed, shards)
    whole = artifacts.update_cache(loaded, *map(artifacts.read_cache, shards))
    assert result.entries == len(whole.entries)
    return (result, streamed.read_bytes(), [c.describe() for c in whole.conflicts],
            loaded.read_bytes())


def test_the_streamed_merge_writes_the_bytes_and_conflicts_of_the_whole_merge(
        tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write(tmp_path / "a.json", corpus(150))
    # the same code and environment, other winners on some keys: conflicts
    b = write(tmp_path / "b.json", corpus(150, start=100, host="h2", shift=2))
    c = write(tmp_path / "c.json", corpus(60, start=280, host="h3"))
    monkeypatch.setattr(corpus_files, "update_cache", None)  # the streamed walk only
    result = corpus_files.merge_files(tmp_path / "out.json", [a, b, c])
    monkeypatch.undo()
    assert result.conflicts
    for shards, out_bytes in (([a, b, c], None), ([b, c], a.read_bytes()),
                              ([a], a.read_bytes())):
        result, streamed, conflicts, loaded = merged_both_ways(tmp_path, shards, out_bytes)
        assert streamed == loaded
        assert [c.describe() for c in result.conflicts] == conflicts


def test_a_merge_that_leaves_a_table_row_unused_writes_what_the_whole_merge_writes(
        tmp_path: Path, small_blocks: None) -> None:
    """Every entry of the newer shard wins: the older one's run and environment rows
    are used by no merged entry, and are not written."""
    old = [cache_entry(f"b{i:04d}", host="old", since=T0, environment={"numpy": "1"})
           for i in range(40)]
    new = [cache_entry(f"b{i:04d}", host="new", since=T1, environment={"numpy": "2"})
           for i in range(40)]
    shards = [write(tmp_path / "old.json", old), write(tmp_path / "new.json", new)]
    _, streamed, _, loaded = merged_both_ways(tmp_path, shards)
    assert streamed == loaded
    assert b'"host":"old"' not in streamed


def test_a_bad_shard_is_named_before_a_locked_out(tmp_path: Path) -> None:
    good = write(tmp_path / "good.json", corpus(5))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    out = tmp_path / "out.json"
    with artifacts.cache_lock(out), pytest.raises(ArtifactError, match=r"bad\.json"):
        corpus_files.merge_files(out, [good, bad], timeout=0.05)
    with artifacts.cache_lock(out), pytest.raises(ArtifactError, match="cannot lock"):
        corpus_files.merge_files(out, [good], timeout=0.05)


def test_a_merged_file_reads_back_as_the_merge_of_the_shards(tmp_path: Path,
                                                            small_blocks: None) -> None:
    a, b = corpus(120), corpus(120, start=60, host="h2", shift=3)
    shards = [write(tmp_path / "a.json", a), write(tmp_path / "b.json", b)]
    out = tmp_path / "out.json"
    corpus_files.merge_files(out, shards)
    from pytest_arbiter.store.corpus import merge

    assert artifacts.read_cache(out).entries() == merge(MeasureCache(a),
                                                        MeasureCache(b)).cache().entries()


def test_a_dry_run_forget_reads_a_block_at_a_time_and_starts_again_when_it_must(
        tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``forget --dry-run`` asks ``picks`` about a block of entries at a time; a file
    found out of order after some blocks is read whole, and ``again()`` tells the caller
    to forget what it counted so far."""
    lines = encode_document(corpus(100)).split(b"\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(b'    {"device":'))
    head, rows, tail = lines[:first], lines[first:first + 100], lines[first + 100:]
    swapped = [*rows[:90], rows[99] + b",", *rows[90:98], rows[98].rstrip(b",")]
    path = tmp_path / "late.json"
    path.write_bytes(b"\n".join(head + swapped + tail))
    asked: list[CacheEntry] = []
    gone, remain = artifacts.forget_entries(path, lambda e: asked.append(e) or e.bucket < "b0050",
                                            dry_run=True, again=asked.clear)
    assert len(asked) == 100 and (len(gone), remain) == (50, 50)
    assert gone == [e for e in artifacts.read_cache(path).entries() if e.bucket < "b0050"]
    ordered = write(tmp_path / "c.json", corpus(100))
    monkeypatch.setattr(artifacts, "read_cache", None)  # the blocks only
    gone, remain = artifacts.forget_entries(ordered, lambda e: e.bucket < "b0050",
                                            dry_run=True)
    assert (len(gone), remain) == (50, 50)


def test_blocks_read_without_sharing_names_are_the_same_entries_checked_alike(
        tmp_path: Path, small_blocks: None) -> None:
    """A block read and let go (``show``, ``diff``, ``merge``) keeps no table of the
    names its entries repeat, and gives the same entries; an impossible row is refused
    as ever, naming the file and the entry."""
    path = write(tmp_path / "c.json", corpus(300))
    unshared = _Tables(shared=False)
    with path.open("rb") as file:
        blocks = list(key_blocks(file, unshared))
    assert unshared.strings is None
    assert [e for b in blocks for e in b] == artifacts.read_cache(path).entries()
    text = path.read_text()
    lines = text.split("\n")
    first = next(i for i, line in enumerate(lines) if '{"device":' in line)
    at = next(i for i, line in enumerate(lines) if '"bucket":"b0200"' in line)
    lines[at] = lines[at].replace('"q1_ns":', '"q1_ns":9', 1)  # past its median
    path.write_text("\n".join(lines))
    with pytest.raises(ArtifactError, match="latencies must satisfy") as raised:
        artifacts.each_block(path, len, shared=False)
    assert "c.json" in str(raised.value) and f"entries[{at - first}]" in str(raised.value)


@pytest.mark.parametrize("layout", ["writer", "compact"])
def test_changes_described_a_run_at_a_time_are_described_alike(
        tmp_path: Path, small_blocks: None, layout: str) -> None:
    """``describe_run`` is given each run of changes of one kind, in key order, with the
    old and the new entries of their keys: the lines are the ones ``describe`` gives
    each change, and the diff is the same."""
    old, new = corpus(150), corpus(150, start=90, host="h2", shift=1)
    paths = write(tmp_path / "old.json", old), write(tmp_path / "new.json", new)
    if layout == "compact":
        for path in paths:
            path.write_text(json.dumps(json.loads(path.read_text())))
    runs: list[tuple[str, int]] = []

    def run(kind: corpus_files.Kind, before: list[CacheEntry], after: list[CacheEntry]
            ) -> list[tuple[str, ...]]:
        runs.append((kind, len(before or after)))
        if kind == "changed":
            return [described(WinnerChange(a.key, a, b))
                    for a, b in zip(before, after, strict=True)]
        return [described(KeyChange(a, None) if kind == "removed" else KeyChange(None, a))
                for a in before or after]

    one_by_one = corpus_files.diff_files(*paths, described)
    assert corpus_files.diff_files(*paths, described, run) == one_by_one
    for kind in ("changed", "added", "removed"):
        assert sum(n for k, n in runs if k == kind) == len(getattr(one_by_one, kind))
    assert len(runs) > (3 if layout == "writer" else 2)


def _shard(draw: st.DrawFn, host: str) -> list[CacheEntry]:
    """Entries of some of a few keys, of one host's code and environment (or none):
    winners, confidences and since drawn, so that shards agree, differ and conflict on
    shared keys."""
    keys = draw(st.lists(st.integers(0, 30), unique=True, min_size=1, max_size=25))
    fingerprints = draw(st.sampled_from([{}, {"a": "0" * 16, "b": "1" * 16},
                                         {"a": "2" * 16, "b": "1" * 16}]))
    environment = draw(st.sampled_from([{}, {"numpy": "1"}, {"numpy": "2"}]))
    return [cache_entry(f"b{key:03d}", winner, runner_up="b" if winner == "a" else "a",
                        device=f"dev{key % 2}", host=host, since=draw(st.sampled_from([T0, T1])),
                        fingerprints=fingerprints, environment=environment,
                        confidence=draw(st.sampled_from([0.5, 0.999, 0.9995])),
                        samples=draw(st.integers(20, 22)))
            for key in keys for winner in [draw(st.sampled_from("ab"))]]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_generated_shards_merge_streamed_as_they_merge_whole(data: st.DataObject) -> None:
    """Shards of generated entries (a key in several, the same entry twice, conflicts,
    rows no merged entry uses, entries without a run, environment or candidates), into
    a new OUT and into one that holds the first shard: the bytes and conflicts of the
    whole-file merge."""
    hosts = data.draw(st.lists(st.sampled_from(["h1", "h2", "h3"]), min_size=1, max_size=3))
    shards = [_shard(data.draw, host) for host in hosts]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        paths = [write(tmp / f"s{at}.json", shard) for at, shard in enumerate(shards)]
        for out_bytes in (None, paths[0].read_bytes()):
            result, streamed, conflicts, loaded = merged_both_ways(tmp, paths, out_bytes)
            assert streamed == loaded
            assert [c.describe() for c in result.conflicts] == conflicts
