"""Whether a cache entry still describes the candidates and the environment of this run.

An entry records every candidate it considered, with the fingerprint of its code, and
the environment its timings were taken under (:mod:`pytest_arbiter.extend.fingerprint`). Read
against the candidates registered now, an entry is, tier by tier:

* **current**: nothing changed; the ranking is used as it is;
* **winner changed**: the cached winner's code changed since it was measured; its
  timings say nothing about the code that would run, so the entry is not used: the key
  is measured again under ``--arbiter-tune``, else the tier order runs;
* **to measure**: a candidate that applies was never measured for the key, or its code
  changed; the ranking is still used, the next ``--arbiter-tune`` times those
  candidates against the cached leader and updates the entry;
* **to re-verify**: the environment changed (a new driver, CuPy, NumPy or BLAS), or the
  entry says so; the ranking is kept and the next ``--arbiter-tune`` re-times the winner
  against the runner-up.

An entry without its considered rows (one built by hand) does not know what it was
measured against: only candidates missing from its ranking count as never measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.ops import Op
from pytest_arbiter.extend.fingerprint import fingerprint_of, op_fingerprint
from pytest_arbiter.store.cache import RETRIED, CacheEntry, Considered


@dataclass(frozen=True)
class Freshness:
    """What changed since ``entry`` was measured (empty tuples: nothing)."""

    changed: tuple[str, ...]
    """Candidates whose code changed since the entry was measured."""
    unmeasured: tuple[str, ...]
    """Candidates that can run the key but were never measured for it."""
    winner_changed: bool
    """The cached winner's code changed: the entry is not used."""
    environment: tuple[str, ...]
    """What differs in the environment (``numpy 2.3.1 -> 2.4.0``), or why the entry is
    marked for re-verification."""

    @property
    def current(self) -> bool:
        return not (self.changed or self.unmeasured or self.environment)

    @property
    def to_measure(self) -> tuple[str, ...]:
        """The candidates the next tune times against the cached leader."""
        return tuple(sorted({*self.changed, *self.unmeasured}))

    def notes(self, winner: str) -> dict[str, str]:
        """One line per kind of staleness, keyed ``winner-changed``, ``unmeasured`` and
        ``reverify`` (what the summary counts and lists)."""
        out: dict[str, str] = {}
        if self.winner_changed:
            out["winner-changed"] = (f"the cached winner {winner} changed code since it "
                                     "was measured")
        changed = [n for n in self.changed if not (self.winner_changed and n == winner)]
        if self.unmeasured or changed:
            parts = []
            if self.unmeasured:
                parts.append("never measured: " + ", ".join(self.unmeasured))
            if changed:
                parts.append("code changed since measured: " + ", ".join(changed))
            out["unmeasured"] = "; ".join(parts)
        if self.environment:
            out["reverify"] = "measured under another environment: " + ", ".join(
                self.environment)
        return out


VERDICTS = frozenset({"rejected", "error", "declined", "inputs_declined"})
"""The outcomes of a considered row that are a verdict on the candidate for the op (the
gate's, or a timing's): made against the op's definition as well as the code."""


def verdict_op(op: Op | None, outcome: str) -> str:
    """The ``op_fingerprint`` a considered row of ``outcome`` records: a verdict on a
    user op's candidate (:data:`VERDICTS`), the op definition's; else empty."""
    if op is None or outcome not in VERDICTS:
        return ""
    return op_fingerprint(op) or ""


def row_current(row: Considered, candidate: Candidate, op: Op | None) -> bool:
    """Whether ``row`` was made against ``candidate``'s code as it is now and, for a
    verdict on a user op's candidate, against ``op``'s definition as it is now."""
    return (row.fingerprint == fingerprint_of(candidate)
            and (op is None or row.outcome not in VERDICTS
                 or row.op_fingerprint == verdict_op(op, row.outcome)))


def vouched(entry: CacheEntry | None, candidate: Candidate,
            environment: Mapping[str, str]) -> bool:
    """Whether ``entry`` vouches for ``candidate``'s current code here: it passed the F4
    gate and was timed for the key with the code it has now, under this ``environment``
    (a new driver, CuPy or BLAS is when a kernel can start to give wrong answers). What
    lets a run with the gate off (production) skip the gate for it."""
    if entry is None:
        return False
    if entry.environment and dict(entry.environment) != dict(environment):
        return False
    if not entry.considered:  # built by hand: its ranking was gated when measured
        return any(r.name == candidate.name for r in entry.ranking)
    seen: Considered | None = entry.considered.get(candidate.name)
    return (seen is not None and seen.outcome == "timed"
            and seen.fingerprint == fingerprint_of(candidate))


def freshness(entry: CacheEntry, candidates: Iterable[Candidate],
              environment: Mapping[str, str], accepting: Iterable[str] | None = None,
              *, retry_declined: bool = False, op: Op | None = None) -> Freshness:
    """``entry`` read against ``candidates`` (those that apply to its key and are
    available) and the current ``environment``. Only candidates named in ``accepting``
    (all when None: those that accept the inputs at hand) count as never measured.
    A candidate whose row leaves it to be measured again (``accepts_declined``,
    ``unavailable``: :data:`~pytest_arbiter.store.cache.RETRIED`) counts as never measured;
    with ``retry_declined`` (a tuning dispatch), so does one whose row is
    ``inputs_declined``. With ``op``, a verdict's row (rejected, raised, declined) is
    out of date when the op's definition changed too (:func:`row_current`)."""
    can_run = None if accepting is None else set(accepting)
    ranked = {r.name for r in entry.ranking}
    considered = entry.considered
    retried = RETRIED if retry_declined else RETRIED - {"inputs_declined"}
    known = ranked | set(entry.rejected) | {
        name for name, seen in considered.items() if seen.outcome not in retried}
    changed: list[str] = []
    unmeasured: list[str] = []
    for cand in candidates:
        seen = considered.get(cand.name)
        if seen is not None and not row_current(seen, cand, op):
            changed.append(cand.name)
        elif cand.name not in known and (can_run is None or cand.name in can_run):
            unmeasured.append(cand.name)
    env_notes: list[str] = []
    if entry.environment and dict(entry.environment) != dict(environment):
        for name in sorted({*entry.environment, *environment}):
            old, new = entry.environment.get(name), environment.get(name)
            if old != new:
                env_notes.append(f"{name} {old or '(none)'} -> {new or '(none)'}")
    if entry.reverify and not env_notes:
        env_notes.append("marked for re-verification")
    return Freshness(tuple(sorted(changed)), tuple(sorted(unmeasured)),
                     entry.winner in changed, tuple(env_notes))
