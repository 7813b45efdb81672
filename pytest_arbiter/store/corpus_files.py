"""``pytest-arbiter diff`` and ``merge`` on files: caches in the writer's layout walked
side by side in key order, a block of entries of each at a time, so that neither a
million-entry corpus nor the result is ever whole in memory.

A file not in the writer's layout, one whose keys are out of order or listed twice (a
file edited by hand, a resolved git conflict), or anything wrong in one, and the files
are read whole instead (:func:`pytest_arbiter.store.artifacts.read_cache`): the result,
and the error, is then the one :func:`pytest_arbiter.store.corpus.diff` and
:func:`pytest_arbiter.store.artifacts.update_cache` give, which the streamed walk gives
too.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Generic, TypeVar

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store.artifacts import (
    LOCK_TIMEOUT_S,
    cache_lock,
    read_cache,
    update_cache,
    write_bytes_atomic,
)
from pytest_arbiter.store.cache_file import (
    Rows,
    Unstreamable,
    entry_lines,
    head_bytes,
    key_blocks,
    keyed_blocks,
)
from pytest_arbiter.store.corpus import Conflict, KeyChange, WinnerChange, diff_sorted, merge_key
from pytest_arbiter.store.entry import CacheEntry, KeyTuple
from pytest_arbiter.store.tables import NO_CONSIDERED, NO_ENVIRONMENT, NO_RUN, _Tables

T = TypeVar("T")

FilePath = str | os.PathLike[str]


# -- diff ------------------------------------------------------------------------------


@dataclass
class DescribedDiff(Generic[T]):
    """:class:`pytest_arbiter.store.corpus.CacheDiff` with each change kept as what the
    caller's ``describe`` made of it (a line of text: never the entries themselves)."""

    changed: list[T] = field(default_factory=list)
    added: list[T] = field(default_factory=list)
    removed: list[T] = field(default_factory=list)
    same: int = 0


def diff_files(old: FilePath, new: FilePath, describe: Callable[[WinnerChange | KeyChange], T]
               ) -> DescribedDiff[T]:
    """The diff of the caches at ``old`` and ``new``, each change described, in key
    order; ``ArtifactError`` as :func:`~pytest_arbiter.store.artifacts.read_cache` says
    of the first one that cannot be read."""
    try:
        return _described(diff_sorted(_entries(old), _entries(new)), describe)
    except (OSError, Unstreamable):
        pass
    before = read_cache(old)
    after = read_cache(new)
    return _described(diff_sorted(before.entries(), after.entries()), describe)


def _entries(path: FilePath) -> Iterator[CacheEntry]:
    with open(path, "rb") as file:  # each change is described, its entries let go
        for block in key_blocks(file, _Tables(shared=False)):
            yield from block


def _described(changes: Iterable[WinnerChange | KeyChange | None],
               describe: Callable[[WinnerChange | KeyChange], T]) -> DescribedDiff[T]:
    out: DescribedDiff[T] = DescribedDiff()
    for change in changes:
        if change is None:
            out.same += 1
        elif isinstance(change, WinnerChange):
            out.changed.append(describe(change))
        else:
            (out.added if change.old is None else out.removed).append(describe(change))
    return out


# -- merge -----------------------------------------------------------------------------


@dataclass
class MergedFile:
    """What a merge into a file left there: how many entries, the conflicts met."""

    entries: int
    conflicts: list[Conflict]


def merge_files(out: FilePath, shards: Sequence[FilePath], *, timeout: float = LOCK_TIMEOUT_S
                ) -> MergedFile:
    """The caches at ``shards`` merged into the cache at ``out`` (created if missing)
    under its lock: the file, and the conflicts, that ``update_cache(out,
    *map(read_cache, shards))`` gives. ``ArtifactError`` names the first shard that
    cannot be read, else ``out`` (unreadable, or not writable)."""
    lock = contextlib.ExitStack()
    try:
        lock.enter_context(cache_lock(out, timeout))
    except ArtifactError:
        for shard in shards:  # a bad shard is named before the lock, as it always was
            read_cache(shard)
        raise
    with lock:
        try:
            return _merge_streamed(out, shards)
        except (OSError, Unstreamable):
            pass
    result = update_cache(out, *map(read_cache, shards), timeout=timeout)
    return MergedFile(len(result.entries), result.conflicts)


_SHARED = (("provenance.run", "runs", NO_RUN),
           ("environment", "environments", NO_ENVIRONMENT),
           ("considered", "considered", NO_CONSIDERED))
"""An entry's shared objects: where the entry holds one, the file's table of them, and
the one no table holds."""


class _Part:
    """One file's entries, a block at a time, with the keys of the block."""

    def __init__(self, blocks: Iterator[tuple[list[CacheEntry], list[KeyTuple]]]) -> None:
        self.blocks = blocks
        self.block: list[CacheEntry] = []
        self.keys: list[KeyTuple] = []
        self.at = 0
        self.next_block()

    def next_block(self) -> None:
        self.block, self.keys = next(self.blocks, ([], []))
        self.at = 0

    def take(self, bound: KeyTuple) -> tuple[list[CacheEntry], list[KeyTuple]]:
        """The entries of the block up to key ``bound``, and their keys; the next block
        when it is all taken."""
        start = self.at
        end = self.at = bisect.bisect_right(self.keys, bound, start)
        taken = self.block[start:end], self.keys[start:end]
        if end == len(self.block):
            self.next_block()
        return taken


def _merge_streamed(out: FilePath, shards: Sequence[FilePath]) -> MergedFile:
    paths = [out, *shards] if os.path.exists(out) else list(shards)
    with contextlib.ExitStack() as files:
        tables = [_Tables(shared=False) for _ in paths]  # each window written, let go
        parts = [_Part(keyed_blocks(files.enter_context(open(path, "rb")), t))
                 for path, t in zip(paths, tables, strict=True)]
        if not parts or any(not p.block for p in parts):
            raise Unstreamable
        rows = [Rows([row for t in tables for row in getattr(t, table)], empty)
                for _, table, empty in _SHARED]
        merged = MergedFile(0, [])
        write_bytes_atomic(out, _checked(_windows(parts, merged), rows, merged))
    merged.conflicts.sort(key=lambda c: (c.key, c.other.winner))
    return merged


def _windows(parts: list[_Part], merged: MergedFile) -> Iterator[list[CacheEntry]]:
    """The merged entries in key order, a window of keys at a time: every part's
    entries up to the smallest last key of the parts' blocks, sorted (the parts are
    sorted runs: a C merge of them), each key met twice folded by the merge rule."""
    while True:
        live = [p for p in parts if p.block]
        if not live:
            return
        bound = min(p.keys[-1] for p in live)
        window: list[CacheEntry] = []
        keys: list[KeyTuple] = []
        for entries, their_keys in [p.take(bound) for p in live]:
            window += entries
            keys += their_keys
        if len(live) > 1:  # stable: a key's entries stay in the parts' order
            order = sorted(range(len(keys)), key=keys.__getitem__)
            window = list(map(window.__getitem__, order))
            keys = list(map(keys.__getitem__, order))
        twice = list(itertools.compress(range(len(keys) - 1),
                                        map(operator.eq, keys, keys[1:])))
        if twice:
            window = _folded(window, keys, twice, merged)
        merged.entries += len(window)
        yield window


def _folded(window: list[CacheEntry], keys: list[KeyTuple], twice: list[int],
            merged: MergedFile) -> list[CacheEntry]:
    """``window`` with the entries of each key it holds more than once replaced by the
    one the merge rule keeps. ``twice``: the positions whose key the next one repeats
    (a run of consecutive positions is one key's)."""
    out: list[CacheEntry] = []
    start = i = 0
    while i < len(twice):
        j = i
        while j + 1 < len(twice) and twice[j + 1] == twice[j] + 1:
            j += 1
        first, end = twice[i], twice[j] + 2
        out += window[start:first]
        kept, conflicts = merge_key(keys[first], window[first:end])
        out.append(kept)
        merged.conflicts += conflicts
        start, i = end, j + 1
    out += window[start:]
    return out


def _checked(windows: Iterator[list[CacheEntry]], rows: list[Rows], merged: MergedFile
             ) -> Iterator[bytes]:
    """The file of the merged entries, its tables every row of the parts' tables;
    :class:`Unstreamable` at the end (before the file is replaced) unless the entries
    use every row and no other, as the writer's tables of them would be."""
    used: list[set[int]] = [set() for _ in rows]
    getters = [attrgetter(name) for name, _, _ in _SHARED]

    def noted(window: list[CacheEntry]) -> list[CacheEntry]:
        for ids, get in zip(used, getters, strict=True):
            ids.update(map(id, map(get, window)))
        return window

    yield head_bytes(*rows)
    yield from entry_lines(map(noted, windows), *rows)
    empties = [id(empty) for _, _, empty in _SHARED]
    for ids, table, empty in zip(used, rows, empties, strict=True):
        ids.discard(empty)
        if ids != table.by_id.keys():
            raise Unstreamable
    if not merged.entries:
        raise Unstreamable

