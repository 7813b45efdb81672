"""Reading and writing the JSON artifacts: the cache and the dispatch histogram.

Writes are atomic (a temporary file in the same folder, fsync, ``os.replace``), so a
failed or killed run never leaves a half-written artifact behind. Cache writes also
hold a lock file beside the cache (``NAME.lock``, :mod:`filelock`), and
:func:`update_cache` reads, merges and writes under it, so processes adding entries
to one cache at the same time lose none. A path that is a symbolic link is written
(and locked) at the file it points to, so the link stays a link.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import filelock

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store.cache import CacheEntry, KeyTuple, MeasureCache, plain_key
from pytest_arbiter.store.cache_file import (
    Unstreamable,
    encode_chunks,
    encode_document,
    in_key_order,
    key_blocks,
    lazy_entries,
    read_document,
)
from pytest_arbiter.store.cache_splice import FileRange, Layout, close_sources, spliced
from pytest_arbiter.store.corpus import MergeResult, Part, cache_of, entries_of, merge
from pytest_arbiter.store.safetext import escape
from pytest_arbiter.store.tables import _Tables

T = TypeVar("T")

LOCK_TIMEOUT_S = 120.0
"""How long a cache write waits for another process's lock before giving up."""


def dumps(data: Any) -> str:
    """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for the block (only :func:`read_json` still
    uses it; the cache's structs leave the collector nothing to walk)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_json(text: str | bytes, source: str) -> Any:
    """JSON from ``text``; ``ArtifactError`` naming ``source`` and the position.

    Strict (:mod:`pytest_arbiter.store.strictjson`): UTF-8 without a byte order mark, no key
    twice in one object, finite numbers, no lone surrogates, bounded nesting.
    """
    from pytest_arbiter.store import strictjson

    try:
        data = text.encode("utf-8") if isinstance(text, str) else text
        return strictjson.decode(data, source)
    except UnicodeEncodeError:
        raise ArtifactError(f"{escape(source)} is not valid JSON: it holds a lone "
                            "surrogate") from None
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of an artifact; ``ArtifactError`` naming it if it cannot be read."""
    p = Path(path)
    try:
        return p.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read {escape(p)}: {escape(exc.strerror or exc)}"
                            ) from None


def read_json(path: str | os.PathLike[str]) -> Any:
    data = read_bytes(path)
    with gc_paused():
        return parse_json(data, str(path))


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def _mode_for(path: Path) -> int:
    """The replaced file's permissions, else what the umask gives a new file."""
    try:
        return path.stat().st_mode & 0o777
    except OSError:
        return 0o666 & ~_UMASK


def target(path: str | os.PathLike[str]) -> Path:
    """Where a write of ``path`` goes: the file a symbolic link points to (through any
    chain of links), else ``path`` itself.

    Replacing the link itself would turn it into a regular file and leave the file it
    pointed to, and whoever else reads it, behind. A link to nothing is an
    ``ArtifactError``: following it would create a file wherever it points, maybe
    outside the checkout.
    """
    p = Path(path)
    if not os.path.islink(p):
        return p
    real = Path(os.path.realpath(p))
    if not real.exists():
        raise ArtifactError(f"{escape(p)} is a symbolic link to {escape(real)}, which does "
                            "not exist: refusing to create a file there (remove the link, "
                            "or create its target)")
    return real


def write_bytes_atomic(path: str | os.PathLike[str],
                       data: bytes | Iterable[bytes | FileRange]) -> None:
    """Replace the file at ``path`` (at its target if it is a symbolic link) with
    ``data`` (bytes, or pieces of it written one after the other, a :class:`FileRange`
    copied from its file): a temporary file in the same folder, fsync, ``os.replace``."""
    p = target(path)
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ArtifactError(f"cannot write {escape(path)}: {escape(exc.strerror or exc)}"
                            ) from None
    try:
        # mkstemp makes the file 0600: give it the mode a plain open() would have had
        os.chmod(tmp, _mode_for(p))
        with os.fdopen(fd, "wb") as out:
            if isinstance(data, bytes):
                out.write(data)
            else:
                for piece in data:
                    if isinstance(piece, FileRange):
                        out.flush()
                        _copy_range(piece, out.fileno())
                    else:
                        out.write(piece)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ArtifactError(f"cannot write {escape(path)}: {escape(exc.strerror or exc)}"
                            ) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM}
"""What ``os.copy_file_range`` says where it cannot copy between these two files."""


def _copy_range(piece: FileRange, fd: int) -> None:
    """Append ``piece`` to the file open at ``fd``: copied in the kernel (no pass through
    this process's memory) where the system can, else read and written a block at a
    time."""
    source, offset, left = piece.source.fileno(), piece.offset, piece.length
    copy = getattr(os, "copy_file_range", None)
    while left and copy is not None:
        try:
            done = copy(source, fd, left, offset)
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY:
                raise
            break
        if not done:
            raise OSError(errno.EIO, "the file being copied is shorter than it was")
        offset, left = offset + done, left - done
    while left:
        block = os.pread(source, min(left, 1 << 24), offset)
        if not block:
            raise OSError(errno.EIO, "the file being copied is shorter than it was")
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view):]
        offset, left = offset + len(block), left - len(block)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """:func:`write_bytes_atomic` of ``text`` in UTF-8."""
    write_bytes_atomic(path, text.encode("utf-8"))


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file of the cache at ``path``: ``NAME.lock`` beside the file (beside the
    file a symbolic link points to, where the writes go)."""
    p = target(path)
    return p.with_name(p.name + ".lock")


@contextmanager
def cache_lock(path: str | os.PathLike[str], timeout: float = LOCK_TIMEOUT_S
               ) -> Iterator[None]:
    """Hold the cache's lock file; ``ArtifactError`` if it cannot be had in ``timeout``.

    Only writers take it (readers see whole files thanks to the atomic replace). While
    it is held, no other writer can be between its write and its rename, so temporary
    files of the cache left by killed writers are removed.
    """
    lock = lock_path(path)
    folder = lock.parent
    if not folder.is_dir():
        what = (f"{escape(folder)} is a file, not a folder" if folder.exists()
                else f"the folder {escape(folder)} does not exist")
        raise ArtifactError(f"cannot write {escape(path)}: {what}")
    try:
        with filelock.FileLock(str(lock), timeout=timeout):
            _remove_stale_temps(target(path))
            yield
    except filelock.Timeout:
        raise ArtifactError(f"cannot lock {escape(path)}: {escape(lock)} stayed locked for "
                            f"{timeout:g} s (another pytest-arbiter process is writing it)"
                            ) from None
    except OSError as exc:
        raise ArtifactError(f"cannot lock {escape(path)}: {escape(exc.strerror or exc)} "
                            f"({escape(lock)})") from None


def _remove_stale_temps(path: Path) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    for stale in folder.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def read_cache(path: str | os.PathLike[str]) -> MeasureCache:
    """The cache at ``path`` (any schema version); ``ArtifactError`` naming the path and
    what is wrong: the position of a JSON syntax error, the JSON path of a bad value
    (``$.entries[3].ranking[0].stats.samples``).

    A file listing one key twice (a hand-resolved git conflict) keeps the entry the
    merge rule prefers.
    """
    try:
        return cache_of(read_document(path))
    except OSError as exc:
        raise ArtifactError(f"cannot read {escape(path)}: {escape(exc.strerror or exc)}"
                            ) from None
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def read_entries(path: str | os.PathLike[str]) -> list[CacheEntry]:
    """``read_cache(path).entries()``: the entries sorted by key, one per key, and the
    same errors, without a table by key: a file in the writer's layout whose keys are
    in order (any file this package wrote) is taken as it lies, block by block."""
    entries: list[CacheEntry] = []
    try:
        with open(path, "rb") as file:
            for block in key_blocks(file):
                entries += block
        return entries
    except (OSError, Unstreamable):
        del entries[:]  # read again whole, which names what is wrong
    return read_cache(path).entries()


def each_block(path: str | os.PathLike[str], work: Callable[[list[CacheEntry]], T], *,
               again: Callable[[], None] | None = None, shared: bool = True) -> list[T]:
    """``work`` of each block of :func:`read_entries`' entries, in key order, and the
    same errors; the results. A file in the writer's layout is read a block at a time,
    so its entries are never all in memory; ``work`` may be given the first blocks of a
    file that turns out not to be (then its results go, ``again()`` is called, and it is
    given every entry of the whole read at once): it should keep what it finds in what
    it returns. ``shared`` false: ``work`` keeps no entry's text, so the blocks' entries
    need not share one object for each repeated name (a third of the read's time)."""
    results: list[T] = []
    try:
        with open(path, "rb") as file:
            for block in key_blocks(file, _Tables(shared=shared)):
                results.append(work(block))
        return results
    except (OSError, Unstreamable):
        del results[:]  # read again whole, which names what is wrong
    entries = read_cache(path).entries()
    if again is not None:
        again()
    return [work(entries)]


def ordered_blocks(path: str | os.PathLike[str], *, shared: bool = True
                   ) -> Iterator[list[CacheEntry]]:
    """:func:`read_entries`' entries a block at a time, and the same errors, for output
    that cannot be taken back: a file is read block by block only once its keys alone
    were found in order (else it is read whole); an entry found wrong after the first
    block is the same error, after those blocks. ``shared`` as :func:`each_block`."""
    try:
        with open(path, "rb") as file:
            ordered = in_key_order(file)
    except OSError:
        ordered = False
    given = False
    if ordered:
        try:
            with open(path, "rb") as file:
                for block in key_blocks(file, _Tables(shared=shared)):
                    given = True
                    yield block
            return
        except (OSError, Unstreamable):
            pass
    entries = read_cache(path).entries()  # names what is wrong
    if given:
        raise ArtifactError(f"{escape(path)} changed while it was read: read it again")
    yield entries


Stamp = tuple[int, int, int, int, int]
"""What tells one version of a file from another: device, inode, size, modification and
change times (an atomic replace makes a new inode)."""


def stamp_of(path: str | os.PathLike[str]) -> Stamp | None:
    """The stamp of the file at ``path`` (through symbolic links); ``None`` if there is
    none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class AsRead(NamedTuple):
    """A cache file as a run read it: its stamp, its entries, and, if it is in the
    writer's layout, what :func:`update_cache` needs to write only the changed keys."""

    stamp: Stamp
    cache: MeasureCache
    layout: Layout | None = None


def read_cache_as_read(path: str | os.PathLike[str]
                       ) -> tuple[MeasureCache, AsRead | None]:
    """:func:`read_cache`, and the file as read (``None`` if it changed while it was
    read): given back to :func:`update_cache`, it spares the read under the lock, and
    the encoding of the unchanged entries, while the file is still the one read.

    A file in the writer's layout is read lazily (:mod:`pytest_arbiter.store.cache_lazy`):
    its tables now, no entry's key: a lookup decodes the keys of the lines its search
    lands on and the entry it finds, so a bad entry is an ``ArtifactError`` then, and a
    line no lookup reads is not looked at; any other file is read and checked whole now,
    with the same errors as :func:`read_cache`.
    """
    before = stamp_of(path)
    try:
        data = Path(path).read_bytes()
        lazy = lazy_entries(data, str(path), _merged_by_key)
        if lazy is None:
            entries = read_document(path)
    except OSError as exc:
        raise ArtifactError(f"cannot read {escape(path)}: {escape(exc.strerror or exc)}"
                            ) from None
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None
    layout = None
    if lazy is None:
        cache = cache_of(entries)
    else:
        cache = MeasureCache.of_lazy(lazy)
        if lazy.lines is not None:
            layout = Layout(lazy.tables, lazy.lines, data)
    if before is None or stamp_of(path) != before:
        return cache, None
    return cache, AsRead(before, cache, layout)


def _merged_by_key(entries: list[CacheEntry]) -> dict[KeyTuple, CacheEntry]:
    """The entries by key, a key listed twice keeping the entry the merge rule
    prefers."""
    return merge(entries).entries


def read_cache_stamped(path: str | os.PathLike[str]) -> tuple[MeasureCache, Stamp | None]:
    """:func:`read_cache`, and the stamp of the file it read (``None`` if the file changed
    while it was read): :func:`read_cache_as_read` less the layout."""
    cache, as_read = read_cache_as_read(path)
    return cache, None if as_read is None else as_read.stamp


def cache_bytes(entries: Iterable[CacheEntry]) -> bytes:
    """The file of ``entries`` (schema version 3)."""
    return encode_document(entries)


def _write_entries(path: str | os.PathLike[str], entries: Iterable[CacheEntry]) -> None:
    """Write the file of ``entries`` at ``path`` a piece at a time (the caller holds the
    lock)."""
    try:
        write_bytes_atomic(path, encode_chunks(entries))
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"cannot write {escape(path)}: {escape(exc)}") from None


def write_cache(path: str | os.PathLike[str], cache: MeasureCache) -> None:
    """Replace the cache at ``path`` with ``cache`` (under its lock)."""
    with cache_lock(path):
        _write_entries(path, cache)


def update_cache(path: str | os.PathLike[str], *parts: Part,
                 timeout: float = LOCK_TIMEOUT_S,
                 known: tuple[Stamp, MeasureCache] | AsRead | None = None,
                 measured_now: bool = False) -> MergeResult:
    """Merge ``parts`` into the cache at ``path`` (created if missing), under its lock.

    The current file is read under the lock, so entries another process added since
    are kept. An unreadable current file is an ``ArtifactError`` and is left untouched.
    ``known``, a stamp (:func:`read_cache_stamped`) and the entries read with it, stands
    for the file while its stamp is the file's under the lock: a run that read the
    corpus at its start does not read it again to add what it measured; with the
    file's layout (:class:`AsRead`), only the changed keys' lines are encoded, the
    others copied (:mod:`pytest_arbiter.store.cache_splice`).
    ``measured_now``: the last part was measured by this run, against the code that
    runs now: it replaces a file entry measured against other code whatever the two
    ``since`` say (a runner whose clock is ahead cannot keep a stale winner).
    Returns the merge: of every key, or, where only the changed keys were written (a
    splice), of the keys ``parts`` hold.
    """
    # a part may be a generator: the merge and the splice's changes both read it
    parts = tuple(p if isinstance(p, (MeasureCache, Mapping, list, tuple)) else list(p)
                  for p in parts)
    with cache_lock(path, timeout):
        if known is not None and stamp_of(path) == known[0]:
            current = known[1]
            if isinstance(known, AsRead) and known.layout is not None:
                spliced_result = _splice_write(path, known, parts, measured_now)
                if spliced_result is not None:
                    return spliced_result
        else:
            current = read_cache(path) if os.path.exists(path) else MeasureCache()
        result = _merged(current, parts, measured_now)
        del current
        _write_entries(path, result.entries.values())
    return result


def _merged(current: MeasureCache | Mapping[KeyTuple, CacheEntry], parts: tuple[Part, ...],
            measured_now: bool) -> MergeResult:
    result = merge(current, *parts)
    if measured_now and parts:
        _prefer_current_code(result, current, parts[-1])
    return result


def _splice_write(path: str | os.PathLike[str], known: AsRead, parts: tuple[Part, ...],
                  measured_now: bool) -> MergeResult | None:
    """Write the file read as ``known`` with the merge of ``parts`` spliced in (only the
    keys ``parts`` hold are looked up: a lazily read file's other entries stay
    undecoded); the merge of those keys, or ``None`` if the file cannot be spliced."""
    current = known.cache
    assert known.layout is not None
    keys = {plain_key(entry) for part in parts for entry in entries_of(part)}
    held = {key: entry for key in keys if (entry := current.get(key)) is not None}
    result = _merged(held, parts, measured_now)
    pieces = spliced(path, known.stamp, known.layout, _changes(result, held, parts))
    if pieces is None:
        return None
    try:
        write_bytes_atomic(path, pieces)
    finally:
        close_sources(pieces)
    return result


def _changes(result: MergeResult, current: Mapping[KeyTuple, CacheEntry],
             parts: tuple[Part, ...]) -> dict[Any, CacheEntry]:
    """The merged entries of the keys ``parts`` hold whose entry is not ``current``'s
    (only those keys can change in a merge)."""
    changes = {}
    for part in parts:
        for entry in entries_of(part):
            key = plain_key(entry)
            kept = result.entries[key]
            if kept is not current.get(key):
                changes[key] = kept
    return changes


def _prefer_current_code(result: MergeResult,
                         current: MeasureCache | Mapping[KeyTuple, CacheEntry],
                         measured: Part) -> None:
    """Each entry of ``measured`` over the file's entry of its key, when the two were
    measured against different code or environments."""
    for entry in entries_of(measured):
        held = current.get(plain_key(entry))
        if held is not None and not held.same_basis(entry):
            result.entries[plain_key(entry)] = entry


def forget_entries(path: str | os.PathLike[str], picks: Callable[[CacheEntry], bool], *,
                   dry_run: bool = False, timeout: float = LOCK_TIMEOUT_S,
                   again: Callable[[], None] | None = None
                   ) -> tuple[list[CacheEntry], int]:
    """Remove the entries of the cache at ``path`` that ``picks``; returns them (sorted
    by key) and how many remain.

    Read, filtered and written under the cache's lock, so an entry another process adds
    meanwhile is kept; nothing is written when nothing goes. ``dry_run`` only reads (no
    lock: readers see whole files), a block of entries at a time (:func:`each_block`:
    ``picks`` may be asked about the first blocks again, after ``again()``, when the
    file turns out not to be in the writer's order). A missing or unreadable file is an
    ``ArtifactError``, and is left untouched.
    """

    def work() -> tuple[list[CacheEntry], int]:
        entries = read_entries(path)
        gone = [e for e in entries if picks(e)]
        if gone and not dry_run:
            chosen = set(map(id, gone))
            _write_entries(path, [e for e in entries if id(e) not in chosen])
        return gone, len(entries) - len(gone)

    def block_work(block: list[CacheEntry]) -> tuple[list[CacheEntry], int]:
        return list(filter(picks, block)), len(block)

    if not os.path.exists(path):
        raise ArtifactError(f"cannot read {escape(path)}: no such file")
    if dry_run:
        found = each_block(path, block_work, again=again)
        gone = [e for block_gone, _ in found for e in block_gone]
        return gone, sum(n for _, n in found) - len(gone)
    with cache_lock(path, timeout):
        return work()
