"""Measured comparisons in pytest-benchmark's JSON format (``--benchmark-json``), so
that ``pytest-benchmark compare`` and github-action-benchmark chart them as they are.

One benchmark per cache key and timed candidate: ``group`` is the key
(``device/target/op/bucket/dtype``), ``name`` the candidate, ``fullname``
``KEY::CANDIDATE`` (stable across runs: what a time series is keyed on). A row kept
from an earlier comparison (``carried``) was not timed with the others and is left out.

The statistics are in seconds, as pytest-benchmark's. The cache keeps the median, the
quartiles and the extremes of each candidate's rounds, not its mean or standard
deviation: ``mean`` is the median, ``stddev`` the interquartile range over 1.349 (the
normal distribution's ratio), and ``extra_info`` says so. No outliers are counted.

A run with ``--arbiter-recheck`` adds, for each key it re-timed, one benchmark per
candidate the recheck timed, under the same ``group``, ``name`` and ``fullname``: its
statistics over the recheck's paired rounds. ``extra_info``'s ``arbiter_source`` says
which it is (``measure`` or ``recheck``).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_arbiter.store.cache import CacheEntry, KeyTuple
from pytest_arbiter.timing.measure import LatencyStats

Recheck = tuple[KeyTuple, str, Mapping[str, LatencyStats]]
"""One key's recheck: the key, the cached winner, each timed candidate's statistics."""

FORMAT_VERSION = "5.1.0"
"""The pytest-benchmark release whose JSON layout this follows (its ``version`` key)."""
IQR_PER_STDDEV = 1.349
NS = 1e9


def _stats(s: LatencyStats) -> dict[str, Any]:
    low, q1, median, q3, high = (v / NS for v in (s.min_ns, s.q1_ns, s.median_ns, s.q3_ns,
                                                  s.max_ns))
    iqr = q3 - q1
    return {
        "min": low, "max": high, "mean": median, "stddev": iqr / IQR_PER_STDDEV,
        "rounds": s.samples, "median": median, "iqr": iqr, "q1": q1, "q3": q3,
        "iqr_outliers": 0, "stddev_outliers": 0, "outliers": "0;0",
        "ld15iqr": max(low, q1 - 1.5 * iqr), "hd15iqr": min(high, q3 + 1.5 * iqr),
        "ops": 1 / median if median > 0 else 0.0, "total": median * s.samples,
        "iterations": 1,
    }


def _benchmark(key: KeyTuple, name: str, stats: LatencyStats, extra: dict[str, Any]
               ) -> dict[str, Any]:
    group = "/".join(key)
    device, target, op, bucket, dtype = key
    return {
        "group": group,
        "name": name,
        "fullname": f"{group}::{name}",
        "params": {"device": device, "target": target, "op": op, "bucket": bucket,
                   "dtype": dtype, "candidate": name},
        "param": name,
        "extra_info": {**extra,
                       "arbiter_stats_note": "mean is the median; stddev is iqr/1.349"},
        "options": {"disable_gc": False, "timer": "pytest-arbiter", "min_rounds": 1,
                    "max_time": None, "min_time": None, "warmup": True},
        "stats": _stats(stats),
    }


def _measured(entry: CacheEntry) -> list[dict[str, Any]]:
    best = entry.ranking[0].stats.median_ns
    return [_benchmark(entry.key, row.name, row.stats, {
        "arbiter_source": "measure",
        "arbiter_rank": rank, "arbiter_winner": rank == 0,
        "arbiter_median_over_winner": row.stats.median_ns / best if best > 0 else None,
        "arbiter_paired_ratio": row.ratio,
        "arbiter_confidence": entry.confidence, "arbiter_tie": entry.tie,
        "arbiter_low_confidence": entry.low_confidence,
        "arbiter_host": entry.provenance.host,
        "arbiter_measured_at": entry.provenance.measured_at or None,
    }) for rank, row in enumerate(entry.ranking) if not row.carried]


def _rechecked(key: KeyTuple, winner: str, stats: Mapping[str, LatencyStats]
               ) -> list[dict[str, Any]]:
    mine = stats.get(winner)
    return [_benchmark(key, name, s, {
        "arbiter_source": "recheck",
        "arbiter_winner": name == winner,
        "arbiter_median_over_winner": (s.median_ns / mine.median_ns
                                       if mine is not None and mine.median_ns > 0
                                       else None),
    }) for name, s in sorted(stats.items())]


def benchmarks(entries: Iterable[CacheEntry], rechecks: Iterable[Recheck] = ()
               ) -> list[dict[str, Any]]:
    """One benchmark per key and candidate timed in the key's latest comparison, then
    one per key and candidate each recheck timed."""
    return ([b for entry in sorted(entries) for b in _measured(entry)]
            + [b for key, winner, stats in sorted(rechecks, key=lambda r: r[0])
               for b in _rechecked(key, winner, stats)])


def machine_info() -> dict[str, Any]:
    """This machine, in pytest-benchmark's keys."""
    return {
        "node": platform.node(), "processor": platform.processor(),
        "machine": platform.machine(), "python_compiler": platform.python_compiler(),
        "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(),
        "python_version": platform.python_version(), "python_build": platform.python_build(),
        "release": platform.release(), "system": platform.system(),
        "cpu": {"arch": platform.machine(), "count": os.cpu_count()},
    }


def commit_info(folder: Path) -> dict[str, Any]:
    """The git commit of ``folder`` (pytest-benchmark's keys), or why there is none."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()

    try:
        commit, when = git("log", "-1", "--format=%H %cI").split(" ", 1)
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        branch = git("rev-parse", "--abbrev-ref", "HEAD")
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"id": commit, "time": when, "author_time": when, "dirty": dirty,
            "project": folder.resolve().name, "branch": branch}


def document(entries: Iterable[CacheEntry], *, commit: dict[str, Any] | None = None,
             now: datetime.datetime | None = None, rechecks: Iterable[Recheck] = ()
             ) -> dict[str, Any]:
    """The whole JSON document pytest-benchmark's ``--benchmark-json`` would write."""
    from pytest_arbiter import __version__

    when = now or datetime.datetime.now(datetime.timezone.utc)
    return {
        "machine_info": machine_info(),
        "commit_info": commit if commit is not None else {},
        "benchmarks": benchmarks(entries, rechecks),
        "datetime": when.isoformat(),
        "version": FORMAT_VERSION,
        "arbiter": {"version": __version__, "python": sys.version.split()[0]},
    }


def write(path: Path, entries: Iterable[CacheEntry], *, commit_folder: Path | None = None,
          rechecks: Iterable[Recheck] = ()) -> int:
    """Write the document to ``path`` (atomically); how many benchmarks it holds."""
    import json

    from pytest_arbiter.store import artifacts

    doc = document(entries, commit=commit_info(commit_folder) if commit_folder else None,
                   rechecks=rechecks)
    artifacts.write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=True,
                                                 allow_nan=False) + "\n")
    return len(doc["benchmarks"])
