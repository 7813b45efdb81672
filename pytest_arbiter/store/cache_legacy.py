"""Reading cache files of versions 1 and 2 (the next write makes them version 3).

Version 2 (written up to the msgspec schema): an entry is an array in the order of the
header's ``entry_fields``, a ranking row one string ``"name median_ns min_ns q1_ns q3_ns
max_ns samples"`` (split at its last six spaces, numbers in decimal notation), and the
provenance that every entry of a run shares sits in ``runs``, an entry pointing at its
row with ``provenance.run``. Version 1 (up to commit ca97b2a): an entry is an object
with an optional ``winner`` (which must be first in the ranking), a row an array of the
seven values. Both forms of entries and rows may appear in either version, as a
hand-written file may mix them.

Each entry is rewritten into the version 3 form and validated by the same models, so
the same things are refused, with the entry's index. An entry from these files does not
know what it was measured against: no ``considered``, no ``environment``, and the
oldest ``since`` (:data:`pytest_arbiter.store.cache.NO_SINCE`), so any measurement that does
know supersedes it in a merge.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from pytest_arbiter.store.cache import (
    CacheEntry,
    _convert,
    _message,
    _read_tables,
    _Tables,
    shapes_text,
)
from pytest_arbiter.store.cache_file import _escape, _refuse

ENTRY_FIELDS = ("device", "target", "op", "bucket", "dtype", "confidence", "tie", "ranking",
                "rejected", "provenance")
"""Version 2's order of the values of an entry array."""

RANKING_FIELDS = ("name", "median_ns", "min_ns", "q1_ns", "q3_ns", "max_ns", "samples")
"""The order of the values of a version 1 or 2 ranking row."""

_STATS = RANKING_FIELDS[1:]
_RUN_FIELDS = ("device_name", "host", "versions")
_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def legacy_entries(data: Any, version: int, *, source: str) -> list[CacheEntry]:
    """The entries of a parsed version 1 or 2 document; ``ValueError`` naming ``source``
    and the first bad entry's index."""
    if not isinstance(data, Mapping):
        _refuse(f"{_escape(source)}: expected a JSON object, got {type(data).__name__}")
    for header, expected in (("entry_fields", ENTRY_FIELDS), ("ranking_fields", RANKING_FIELDS)):
        order = data.get(header, list(expected))
        if order != list(expected):
            _refuse(f"{_escape(source)}: {header!r} is {_escape(order)}, expected "
                    f"{list(expected)!r}")
    runs = data.get("runs", [])
    if type(runs) is not list or not all(type(r) is dict for r in runs):
        _refuse(f"{_escape(source)}: 'runs' must be a list of objects")
    raw = data.get("entries")
    if type(raw) is not list:
        _refuse(f"{_escape(source)}: 'entries' must be a list")
    entries = []
    for i, item in enumerate(raw):
        try:
            # the shared data is inline in the rewritten entry: no tables
            read = functools.partial(_convert, _v3_form(item, runs), CacheEntry)
            entries.append(_read_tables(read, _Tables()))
        except (KeyError, TypeError, ValueError) as exc:
            message = _message(exc) if isinstance(exc, msgspec.ValidationError) else str(exc)
            raise ValueError(f"{_escape(source)}: entries[{i}] is invalid: "
                             f"{_escape(message)}") from None
    return entries


def _v3_form(item: Any, runs: list[dict[str, Any]]) -> dict[str, Any]:
    if type(item) is list:
        if len(item) != len(ENTRY_FIELDS):
            raise ValueError(f"an entry array must have {len(ENTRY_FIELDS)} values "
                             f"({', '.join(ENTRY_FIELDS)}), got {len(item)}")
        item = dict(zip(ENTRY_FIELDS, item, strict=True))
    elif type(item) is not dict:
        raise ValueError(f"an entry must be an array or an object, got {type(item).__name__}")
    unknown = set(item) - {*ENTRY_FIELDS, "winner"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    rows = item.get("ranking")
    if type(rows) is not list or not rows:
        raise ValueError("'ranking' must be a non-empty list")
    ranking = [_row(row) for row in rows]
    winner = item.get("winner", ranking[0]["name"])
    if winner != ranking[0]["name"]:
        raise ValueError(f"winner {winner!r} is not first in the ranking")
    out = {k: item[k] for k in ENTRY_FIELDS if k in item}
    out["ranking"] = ranking
    out["provenance"] = _provenance(item.get("provenance", {}), runs)
    return out


def _row(row: Any) -> dict[str, Any]:
    if type(row) is str:
        values: Any = row.rsplit(" ", len(RANKING_FIELDS) - 1)
        if len(values) == len(RANKING_FIELDS):
            values[1:-1] = [float(v) if _DECIMAL.fullmatch(v) else v for v in values[1:-1]]
            if values[-1].isascii() and values[-1].isdigit():
                values[-1] = int(values[-1])
    else:
        values = row
    if type(values) is not list or len(values) != len(RANKING_FIELDS):
        raise ValueError(f"a ranking row must be a string '{' '.join(RANKING_FIELDS)}' or "
                         f"an array of those {len(RANKING_FIELDS)} values, got {row!r}")
    name, *stats = values
    return {"name": name, "stats": dict(zip(_STATS, stats, strict=True))}


def _provenance(prov: Any, runs: list[dict[str, Any]]) -> Any:
    if type(prov) is not dict:
        raise ValueError(f"'provenance' must be an object, got {prov!r}")
    prov = dict(prov)
    if "run" in prov:
        ref = prov.pop("run")
        if type(ref) is not int or not 0 <= ref < len(runs):
            raise ValueError(f"provenance 'run' {ref!r} is not an index into 'runs' "
                             f"(which has {len(runs)} rows)")
        prov = {**runs[ref], **prov}
    run = {k: prov.pop(k) for k in _RUN_FIELDS if k in prov}
    if run:
        prov["run"] = run
    shapes = prov.get("shapes")
    if type(shapes) is list and all(type(shape) is list and all(
            type(d) is int and d >= 0 for d in shape) for shape in shapes):
        prov["shapes"] = shapes_text(shapes)
    return prov
