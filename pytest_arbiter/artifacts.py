"""Reading and writing the JSON artifacts: the cache and the dispatch histogram.

Writes are atomic (a temporary file in the same folder, fsync, ``os.replace``), so a
failed or killed run never leaves a half-written artifact behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from pytest_arbiter.cache import MeasureCache
from pytest_arbiter.histogram import (
    HISTOGRAM_SCHEMA,
    HISTOGRAM_VERSION,
    HistogramKey,
    counts_from_dict,
    entries_of,
)


class ArtifactError(Exception):
    """An artifact could not be read or written; the message names the path."""


def dumps(data: Any) -> str:
    """Deterministic JSON: sorted keys, two-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def read_json(path: str | os.PathLike[str]) -> Any:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ArtifactError(f"cannot read {p}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{p} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                            f"column {exc.colno} (char {exc.pos})") from None


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise ArtifactError(f"cannot write {p}: {exc.strerror or exc}") from None
    try:
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


def read_cache(path: str | os.PathLike[str]) -> MeasureCache:
    data = read_json(path)
    try:
        return MeasureCache.from_dict(data, source=str(path))
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def write_cache(path: str | os.PathLike[str], cache: MeasureCache) -> None:
    write_text_atomic(path, dumps(cache.to_dict()))


def read_histogram(path: str | os.PathLike[str]) -> dict[HistogramKey, int]:
    data = read_json(path)
    try:
        return counts_from_dict(data, source=str(path))
    except ValueError as exc:
        raise ArtifactError(str(exc)) from None


def histogram_document(counts: dict[HistogramKey, int]) -> dict[str, Any]:
    return {"schema": HISTOGRAM_SCHEMA, "version": HISTOGRAM_VERSION,
            "entries": entries_of(counts)}


def write_histogram(path: str | os.PathLike[str], counts: dict[HistogramKey, int]) -> None:
    write_text_atomic(path, dumps(histogram_document(counts)))
