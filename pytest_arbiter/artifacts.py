"""Reading and writing the JSON artifacts: the cache and the dispatch histogram.

Writes are atomic (a temporary file in the same folder, fsync, ``os.replace``), so a
failed or killed run never leaves a half-written artifact behind. Cache writes also
hold a lock file beside the cache (``NAME.lock``, :mod:`filelock`), and
:func:`update_cache` reads, merges and writes under it, so processes adding entries
to one cache at the same time lose none.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import filelock

from pytest_arbiter.cache import (
    CacheEntry,
    MeasureCache,
    cache_document,
    gc_paused,
    load_entries,
)
from pytest_arbiter.corpus import MergeResult, Part, merge
from pytest_arbiter.histogram import (
    HISTOGRAM_SCHEMA,
    HISTOGRAM_VERSION,
    HistogramKey,
    counts_and_expected,
    counts_from_dict,
    entries_of,
)

LOCK_TIMEOUT_S = 120.0
"""How long a cache write waits for another process's lock before giving up."""


class ArtifactError(Exception):
    """An artifact could not be read or written; the message names the path."""


def dumps(data: Any) -> str:
    """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


_line = json.JSONEncoder(sort_keys=True, allow_nan=False).encode
"""One value as one line of JSON: one encoder for every line (``json.dumps`` with
options builds a new one per call)."""


def cache_text(document: dict[str, Any]) -> str:
    """The cache document as text: the header (schema, version, entry_fields and
    ranking_fields) first, then one line per run and per entry.

    One entry per line keeps a committed corpus's diffs to the entries that changed,
    and lets the C JSON encoder do the work (an indented dump is pure Python).
    """
    head = [f'  "{name}": {_line(document[name])},'
            for name in ("schema", "version", "entry_fields", "ranking_fields")]
    parts = ["{", *head]
    for name, last in (("runs", False), ("entries", True)):
        rows = document[name]
        close = "]" if last else "],"
        if not rows:
            parts.append(f'  "{name}": []{"" if last else ","}')
            continue
        parts.append(f'  "{name}": [')
        parts.append(",\n".join("    " + _line(row) for row in rows))
        parts.append("  " + close)
    parts.append("}")
    return "\n".join(parts) + "\n"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number an artifact may hold")


def parse_json(text: str, source: str) -> Any:
    """JSON from ``text``; ``ArtifactError`` naming ``source`` and the position."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno} (char {exc.pos})") from None
    except ValueError as exc:
        raise ArtifactError(f"{source} is not valid JSON: {exc}") from None


def read_json(path: str | os.PathLike[str]) -> Any:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"cannot read {p}: {getattr(exc, 'strerror', None) or exc}"
                            ) from None
    with gc_paused():
        return parse_json(text, str(p))


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


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ArtifactError(f"cannot write {p}: {exc.strerror or exc}") from None
    try:
        # mkstemp makes the file 0600: give it the mode a plain open() would have had
        os.chmod(tmp, _mode_for(p))
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, p)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ArtifactError(f"cannot write {p}: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file of the cache at ``path``: ``NAME.lock`` in the same folder."""
    p = Path(path)
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
        raise ArtifactError(f"cannot write {path}: the folder {folder} does not exist")
    try:
        with filelock.FileLock(str(lock), timeout=timeout):
            _remove_stale_temps(Path(path))
            yield
    except filelock.Timeout:
        raise ArtifactError(f"cannot lock {path}: {lock} stayed locked for {timeout:g} s "
                            "(another pytest-arbiter process is writing it)") from None
    except OSError as exc:
        raise ArtifactError(f"cannot lock {path}: {exc.strerror or exc} ({lock})") from None


def _remove_stale_temps(path: Path) -> None:
    folder = path.parent if str(path.parent) else Path(".")
    for stale in folder.glob(f".{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def read_cache(path: str | os.PathLike[str]) -> MeasureCache:
    """The cache at ``path``; ``ArtifactError`` naming the path and what is wrong.

    A file listing one key twice (a hand-resolved git conflict) keeps the entry the
    merge rule prefers.
    """
    with gc_paused():
        data = read_json(path)
        try:
            keys, entries = load_entries(data, source=str(path))
        except ValueError as exc:
            raise ArtifactError(str(exc)) from None
        by_key = dict(zip(keys, entries, strict=True))
        if len(by_key) != len(entries):
            return merge(entries).cache()
        return MeasureCache.of_keyed(by_key)


def write_cache(path: str | os.PathLike[str], cache: MeasureCache) -> None:
    """Replace the cache at ``path`` with ``cache`` (under its lock)."""
    text = _cache_text(cache)
    with cache_lock(path):
        write_text_atomic(path, text)


def _cache_text(entries: Iterable[CacheEntry]) -> str:
    try:
        with gc_paused():
            return cache_text(cache_document(entries))
    except ValueError as exc:
        raise ArtifactError(f"cannot encode the cache: {exc}") from None


def update_cache(path: str | os.PathLike[str], *parts: Part,
                 timeout: float = LOCK_TIMEOUT_S) -> MergeResult:
    """Merge ``parts`` into the cache at ``path`` (created if missing), under its lock.

    The current file is read under the lock, so entries another process added since
    are kept. An unreadable current file is an ``ArtifactError`` and is left untouched.
    """
    p = Path(path)
    # no collections from the read to the write: each would walk every object of the
    # corpus just read, which lives only until this returns
    with cache_lock(p, timeout), gc_paused():
        current = read_cache(p) if p.exists() else MeasureCache()
        result = merge(current, *parts)
        write_text_atomic(p, _cache_text(result.entries.values()))
    return result


def read_histogram(path: str | os.PathLike[str]) -> dict[HistogramKey, int]:
    data = read_json(path)
    try:
        return counts_from_dict(data, source=str(path))
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def read_histogram_expected(path: str | os.PathLike[str]
                            ) -> tuple[dict[HistogramKey, int], dict[HistogramKey, int]]:
    """The counts of a histogram file and how many of them were degrades on purpose."""
    data = read_json(path)
    try:
        return counts_and_expected(data, source=str(path))
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def histogram_document(counts: dict[HistogramKey, int],
                       expected: dict[HistogramKey, int] | None = None) -> dict[str, Any]:
    return {"schema": HISTOGRAM_SCHEMA, "version": HISTOGRAM_VERSION,
            "entries": entries_of(counts, expected)}


def write_histogram(path: str | os.PathLike[str], counts: dict[HistogramKey, int],
                    expected: dict[HistogramKey, int] | None = None) -> None:
    write_text_atomic(path, dumps(histogram_document(counts, expected)))
