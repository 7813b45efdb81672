"""What a decision hands back: the pick of one region (:class:`Selection`) and why a key
dispatched as it did (:class:`DispatchEvent`, what the summary and ``--arbiter-explain``
read)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.gate import GateReport
from pytest_arbiter.core.regions import Region
from pytest_arbiter.decision.screen import Notes, screen
from pytest_arbiter.decision.states import RecheckStatus, Source, WinnerOut
from pytest_arbiter.gating.histogram import Outcome
from pytest_arbiter.store.cache import CacheEntry
from pytest_arbiter.timing.measure import Comparison


@dataclass
class Selection:
    """What arbitration chose for one region, and why the others were passed over.

    ``errors``: candidates that raised (in ``accepts``/``available``, the gate or the
    timing); ``rejected``: candidates that failed the F4 gate, with the gate's reason;
    ``found``: what this measurement found wrong, name -> (outcome, reason); ``gated``:
    every candidate the measurement gated (whatever the verdict).
    """

    region: Region
    candidate: Candidate | None
    order: list[Candidate]
    source: Source
    passed_over: dict[str, str] = field(default_factory=dict)
    entry: CacheEntry | None = None
    comparison: Comparison | None = None
    gate_reports: dict[str, GateReport] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    found: dict[str, tuple[Outcome, str]] = field(default_factory=dict)
    gated: frozenset[str] = frozenset()


def arbitrate(region: Region, candidates: Iterable[Candidate],
              inputs: Sequence[Any] | None = None) -> Selection:
    """Static pick: the highest-tier candidate that applies, is available and accepts."""
    notes = Notes()
    found = screen(region, candidates, inputs, notes)
    return Selection(region, found[0] if found else None, found, "static", notes.passed_over,
                     errors=notes.errors)


@dataclass
class DispatchEvent:
    """Why a key dispatched as it did: the source of its pick and the passed-over reasons."""

    target: str
    op: str
    bucket: str
    dtype: str
    source: Source
    order: list[str]
    """The candidates that can serve the key here, in the order they are tried."""
    passed_over: dict[str, str]
    ratios: dict[str, float] = field(default_factory=dict)
    tie: bool = False
    confidence: float = 1.0
    stale: dict[str, str] = field(default_factory=dict)
    """How the key's cache entry is out of date (:meth:`Freshness.notes`): kind -> line."""
    recheck: str = ""
    """What re-timing the cached winner found (``--arbiter-recheck``), for people."""
    recheck_status: RecheckStatus = ""
    """The same, typed: what the summary and the ledger read."""
    ran: str = ""
    """The candidate the key's last dispatch ran (the fast path's: its last planned input
    signature), :data:`~pytest_arbiter.gating.histogram.REFERENCE` when the reference
    did; empty before any ran."""
    fallback: str = ""
    """Why the key's measured winner did not run here and another candidate served
    (a ``degraded`` dispatch); empty when it ran or there is none."""
    low_confidence: bool = False
    """The key's cached pick has too little evidence behind it."""
    winner_out: WinnerOut = ""
    """Why the cached winner did not serve what ``ran`` served, typed (what the summary
    reads); set together with ``ran`` and ``fallback``."""
