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
import functools
import itertools
import operator
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any, Generic, Literal, TypeVar

from msgspec.structs import force_setattr

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
    file_tables,
    head_bytes,
    keyed_blocks,
)
from pytest_arbiter.store.corpus import Conflict, KeyChange, WinnerChange, merge_key
from pytest_arbiter.store.entry import CacheEntry, CacheKey, KeyTuple, plain_key
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


Kind = Literal["changed", "added", "removed"]
DescribeRun = Callable[[Kind, list[CacheEntry], list[CacheEntry]], list[T]]
"""Describes a run of changes of one kind at once, in key order: given the old entries
and the new ones of the keys (one list empty for keys added or removed), a description
of each."""


def diff_files(old: FilePath, new: FilePath, describe: Callable[[WinnerChange | KeyChange], T],
               describe_run: DescribeRun[T] | None = None) -> DescribedDiff[T]:
    """The diff of the caches at ``old`` and ``new``, each change described, in key
    order; ``ArtifactError`` as :func:`~pytest_arbiter.store.artifacts.read_cache` says
    of the first one that cannot be read. ``describe_run``, if given, describes the
    changes a run at a time instead of ``describe`` each."""
    out: DescribedDiff[T] = DescribedDiff()
    try:
        with open(old, "rb") as a, open(new, "rb") as b:
            parts = (_Part(keyed_blocks(a, _Tables(shared=False))),
                     _Part(keyed_blocks(b, _Tables(shared=False))))
            for window in _diff_windows(*parts):  # each change described, its entries let go
                _described(window, out, describe, describe_run)
        return out
    except (OSError, Unstreamable):
        pass
    before = read_cache(old).entries()
    after = read_cache(new).entries()
    out = DescribedDiff()
    _described((before, list(map(plain_key, before)), after, list(map(plain_key, after))),
               out, describe, describe_run)
    return out


_Window = tuple[list[CacheEntry], list[KeyTuple], list[CacheEntry], list[KeyTuple]]
"""The entries of two files over one range of keys, and their keys."""


def _diff_windows(old: _Part, new: _Part) -> Iterator[_Window]:
    """The two files' entries a window of keys at a time: up to the smaller last key of
    the two blocks in hand."""
    while old.block or new.block:
        bound = min(p.keys[-1] for p in (old, new) if p.block)
        yield (*(old.take(bound) if old.block else ([], [])),
               *(new.take(bound) if new.block else ([], [])))


def _described(window: _Window, out: DescribedDiff[T],
               describe: Callable[[WinnerChange | KeyChange], T],
               describe_run: DescribeRun[T] | None) -> None:
    """The changes of one window (each file's entries sorted by key, one per key) into
    ``out``, in key order: the keys of both compared, the rest added or removed."""
    olds, old_keys, news, new_keys = window
    both = set(old_keys).intersection(new_keys)
    changed: tuple[list[CacheEntry], list[CacheEntry]] = ([], [])
    if both:
        removed = [e for e, k in zip(olds, old_keys, strict=True) if k not in both]
        added = [e for e, k in zip(news, new_keys, strict=True) if k not in both]
        pair = ([e for e, k in zip(olds, old_keys, strict=True) if k in both],
                [e for e, k in zip(news, new_keys, strict=True) if k in both])
        differ = list(map(operator.ne, *(list(map(_WINNER, map(_FIRST, map(_RANKING, side))))
                                        for side in pair)))
        out.same += differ.count(False)
        changed = (list(itertools.compress(pair[0], differ)),
                   list(itertools.compress(pair[1], differ)))
    else:
        removed, added = olds, news
    runs: tuple[tuple[Kind, list[CacheEntry], list[CacheEntry], list[T]], ...] = (
        ("changed", *changed, out.changed), ("added", [], added, out.added),
        ("removed", removed, [], out.removed))
    for kind, before, after, into in runs:
        if not (before or after):
            continue
        if describe_run is not None:
            into += describe_run(kind, before, after)
        elif kind == "changed":
            into += [describe(WinnerChange(CacheKey._make(plain_key(b)), a, b))
                     for a, b in zip(before, after, strict=True)]
        else:
            into += [describe(KeyChange(a, None) if kind == "removed" else KeyChange(None, a))
                     for a in before or after]


_RANKING = attrgetter("ranking")
_FIRST = itemgetter(0)
_WINNER = attrgetter("name")


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
_SHARED_OF = attrgetter(*(name for name, _, _ in _SHARED))


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
        opened = [files.enter_context(open(path, "rb")) for path in paths]
        heads = [_Tables(shared=False) for _ in paths]
        for file, head in zip(opened, heads, strict=True):
            file_tables(file, head)
            file.seek(0)
        rows = [Rows([row for t in heads for row in getattr(t, table)], empty)
                for _, table, empty in _SHARED]
        # each file's entries read with the merged file's row numbers in place of the
        # shared rows: written as they are, no encoder hook per entry (each window
        # written, let go)
        numbers = functools.partial(_numbered, rows)
        parts = [_Part(keyed_blocks(file, _Tables(shared=False), numbers)) for file in opened]
        if not parts or any(not p.block for p in parts):
            raise Unstreamable
        merged = MergedFile(0, [])
        write_bytes_atomic(out, _checked(_windows(parts, merged, rows), rows, merged))
    merged.conflicts.sort(key=lambda c: (c.key, c.other.winner))
    return merged


def _numbered(rows: list[Rows], tables: _Tables) -> None:
    """A file's ``tables`` as the merged file's row numbers (``rows``): what its
    entries' indices become as they are read (an empty row stays the object, which no
    table holds); :class:`Unstreamable` if a row is not among ``rows`` (the file
    changed since its tables were read)."""
    for (_, table, empty), merged in zip(_SHARED, rows, strict=True):
        by_id = merged.by_id
        try:
            setattr(tables, table, [o if o is empty else by_id[id(o)]
                                    for o in getattr(tables, table) or ()])
        except KeyError:
            raise Unstreamable from None


def _objects(entries: list[CacheEntry], rows: list[Rows]) -> None:
    """``entries`` pointing at the shared rows again, in place of the row numbers they
    were read with: what the merge rule compares."""
    runs, environments, considered = (table.rows for table in rows)
    for entry in entries:
        read: tuple[Any, Any, Any] = _SHARED_OF(entry)  # row numbers, or the rows
        if type(read[0]) is int:
            force_setattr(entry.provenance, "run", runs[read[0]])
        if type(read[1]) is int:
            force_setattr(entry, "environment", environments[read[1]])
        if type(read[2]) is int:
            force_setattr(entry, "considered", considered[read[2]])


def _numbers(entries: list[CacheEntry], rows: list[Rows]) -> None:
    """``entries``' shared rows as the merged file's row numbers (an empty one, which no
    table holds, stays)."""
    runs, environments, considered = (table.by_id for table in rows)
    for entry in entries:
        read: tuple[Any, Any, Any] = _SHARED_OF(entry)
        force_setattr(entry.provenance, "run", runs.get(id(read[0]), read[0]))
        force_setattr(entry, "environment", environments.get(id(read[1]), read[1]))
        force_setattr(entry, "considered", considered.get(id(read[2]), read[2]))


def _windows(parts: list[_Part], merged: MergedFile, rows: list[Rows]
             ) -> Iterator[list[CacheEntry]]:
    """The merged entries in key order, a window of keys at a time: every part's
    entries up to the smallest last key of the parts' blocks, sorted (the parts are
    sorted runs: a C merge of them), each key met twice folded by the merge rule."""
    while True:
        live = [p for p in parts if p.block]
        if not live:
            return
        bound = min(p.keys[-1] for p in live)
        taken = [part for part in (p.take(bound) for p in live) if part[0]]
        window = taken[0][0]
        if len(taken) > 1:
            # stable: a key's entries stay in the parts' order; one part's entries alone
            # (keys of one shard only) are in order already, and met once each
            window = list(itertools.chain.from_iterable(e for e, _ in taken))
            keys = list(itertools.chain.from_iterable(k for _, k in taken))
            order = sorted(range(len(keys)), key=keys.__getitem__)
            window = list(map(window.__getitem__, order))
            keys = list(map(keys.__getitem__, order))
            twice = list(itertools.compress(range(len(keys) - 1),
                                            map(operator.eq, keys, keys[1:])))
            if twice:
                window = _folded(window, keys, twice, merged, rows)
        merged.entries += len(window)
        yield window


def _folded(window: list[CacheEntry], keys: list[KeyTuple], twice: list[int],
            merged: MergedFile, rows: list[Rows]) -> list[CacheEntry]:
    """``window`` with the entries of each key it holds more than once replaced by the
    one the merge rule keeps (the rule reads the shared rows: the keys' entries point
    at them while it does). ``twice``: the positions whose key the next one repeats (a
    run of consecutive positions is one key's)."""
    _objects(list(map(window.__getitem__, {*twice, *(at + 1 for at in twice)})), rows)
    out: list[CacheEntry] = []
    plain: list[CacheEntry] = []
    start = i = 0
    while i < len(twice):
        j = i
        while j + 1 < len(twice) and twice[j + 1] == twice[j] + 1:
            j += 1
        first, end = twice[i], twice[j] + 2
        out += window[start:first]
        kept, conflicts = merge_key(keys[first], window[first:end])
        out.append(kept)
        if conflicts:  # a conflict shows the kept entry: written through the encoder's hook
            merged.conflicts += conflicts
        else:
            plain.append(kept)
        start, i = end, j + 1
    out += window[start:]
    _numbers(plain, rows)
    return out


def _checked(windows: Iterator[list[CacheEntry]], rows: list[Rows], merged: MergedFile
             ) -> Iterator[bytes]:
    """The file of the merged entries (read with the merged file's row numbers), its
    tables every row of the parts' tables; :class:`Unstreamable` at the end (before the
    file is replaced) unless the entries use every row and no other, as the writer's
    tables of them would be."""
    used: set[tuple[object, object, object]] = set()

    def noted(window: list[CacheEntry]) -> list[CacheEntry]:
        used.update(map(_SHARED_OF, window))
        return window

    yield head_bytes(*rows)
    yield from entry_lines(map(noted, windows), *rows)
    for at, ((_, _, empty), table) in enumerate(zip(_SHARED, rows, strict=True)):
        # a row number, or (read inline, or never in a table) the object itself
        seen = {v if type(v) is int else table.by_id.get(id(v), -1)
                for v in {shared[at] for shared in used} if v is not empty}
        if seen != set(range(len(table.rows))):
            raise Unstreamable
    if not merged.entries:
        raise Unstreamable

