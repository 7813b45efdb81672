"""Building a measured cache entry: the one ranking rule, the considered rows, the
provenance.

The ranking rule (docs/artifacts.md, "The ranking rule"): an entry's order comes only
from candidates timed side by side in one comparison. The rows timed in the entry's
latest comparison come first, in the comparison's order; rows kept from an earlier
comparison follow every one of them, marked ``carried``, in their old order. No median
from another comparison or another shape ever places a row.
"""

from __future__ import annotations

import datetime
import platform
import socket
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.ops import Op
from pytest_arbiter.decision.freshness import row_current, verdict_op
from pytest_arbiter.decision.screen import Notes
from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.extend.fingerprint import fingerprint_of
from pytest_arbiter.store.cache import CacheEntry, Considered, Provenance, RankedCandidate
from pytest_arbiter.store.entry import MAX_RATIO
from pytest_arbiter.timing.measure import Comparison
from pytest_arbiter.timing.pairing import stored_ratio


def ranked_rows(comparison: Comparison, old: CacheEntry | None,
                drop: Iterable[str]) -> tuple[RankedCandidate, ...]:
    """The comparison's rows, then the old entry's other rows (less ``drop``) carried."""
    fresh = [RankedCandidate(n, comparison.stats[n], ratio=_ratio(comparison, n))
             for n in comparison.ranking]
    if old is None:
        return tuple(fresh)
    skip = {r.name for r in fresh} | set(drop)
    carried = [RankedCandidate(r.name, r.stats, True) for r in old.ranking
               if r.name not in skip]
    return (*fresh, *carried)


def _ratio(comparison: Comparison, name: str) -> float | None:
    """``name``'s paired ratio to the pick, to four significant digits (``None`` where the
    comparison has none, or none a file can hold)."""
    ratio = comparison.ratios.get(name)
    if ratio is None or not 0.0 < ratio < float("inf"):
        return None
    shown = stored_ratio(ratio)
    return shown if 0.0 < shown <= MAX_RATIO else None


def considered_rows(pool: Sequence[Candidate], applicable: set[str], usable: set[str],
                    old: CacheEntry | None, partial: bool, timed: set[str],
                    rejected: Mapping[str, str], notes: Notes,
                    inputs_declined: Mapping[str, str],
                    trials: Mapping[str, tuple[str, ...]] | None = None,
                    op: Op | None = None) -> dict[str, Considered]:
    """What became of every candidate considered for the key, with its code's
    fingerprint (a verdict on a user op's candidate: and ``op``'s definition's,
    :func:`~pytest_arbiter.decision.freshness.verdict_op`) and, timed now, the patterns
    of the gate trials it passed (``trials``).
    A row is ``timed`` only for a candidate timed in this comparison, or
    kept from ``old`` with the same fingerprint (a ``partial`` re-measure keeps every
    row of unchanged code); rows of candidates that do not apply here (another runner's)
    are carried as they were, and a candidate unavailable here keeps its old row."""
    out: dict[str, Considered] = {}
    if old is not None:
        out.update((name, row) for name, row in old.considered.items()
                   if name not in applicable)
    for cand in pool:
        name, code = cand.name, fingerprint_of(cand)
        kept = old.considered.get(name) if old is not None else None
        if name not in applicable:
            if kept is None and name in notes.unavailable:
                out[name] = Considered(code, "unavailable", notes.unavailable[name])
            continue
        if name in rejected:
            out[name] = Considered(code, "rejected", rejected[name],
                                   op_fingerprint=verdict_op(op, "rejected"))
        elif name in notes.errors:
            out[name] = Considered(code, "error", notes.errors[name],
                                   op_fingerprint=verdict_op(op, "error"))
        elif name in timed:
            out[name] = Considered(code, "timed", trials=(trials or {}).get(name, ()))
        elif (kept is not None and row_current(kept, cand, op)
              and (partial or kept.outcome == "timed")):
            out[name] = kept  # not re-measured: what it was measured as stands
        elif name not in usable:
            out[name] = Considered(code, "accepts_declined", notes.declined.get(name, ""))
        elif name in inputs_declined:
            out[name] = Considered(code, "inputs_declined", inputs_declined[name],
                                   op_fingerprint=verdict_op(op, "inputs_declined"))
        else:  # it declined in the gate or while timed
            out[name] = Considered(code, "declined",
                                   notes.passed_over.get(name, "not timed for these inputs"),
                                   op_fingerprint=verdict_op(op, "declined"))
    return out


def provenance(device: DeviceInfo, inputs: Sequence[Any], comparison: Comparison,
               timed_alone: bool) -> Provenance:
    """Who measured, when, on what shapes, at what cost."""
    from pytest_arbiter import __version__

    return Provenance.of({
        "host": socket.gethostname(),
        "device_name": device.name,
        "versions": {"pytest-arbiter": __version__, "numpy": np.__version__,
                     "python": platform.python_version()},
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%dT%H:%M:%SZ"),
        "shapes": [list(np.shape(x)) for x in inputs],
        "rounds": comparison.rounds,
        "timed_ns": round(comparison.timed_ns),
        "spent_ns": round(comparison.spent_ns),
        "p_value": comparison.p_value,
        "timed_alone": timed_alone,
    })
