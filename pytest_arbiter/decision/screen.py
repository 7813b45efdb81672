"""Which candidates can run a key's inputs here: applies, available, accepts.

Each question is asked once per candidate and its answer kept in :class:`Notes`: a
typed part that decisions read (who was unavailable, who declined, who raised) and a
line per candidate for people (``passed_over``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.regions import Region
from pytest_arbiter.decision.states import ACCEPTS_FALSE, exc_text
from pytest_arbiter.errors import Decline
from pytest_arbiter.store.cache import CacheEntry


@dataclass
class Notes:
    """What screening found, per candidate name."""

    passed_over: dict[str, str] = field(default_factory=dict)
    """Why each candidate was passed over, for people (``--arbiter-explain``)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Candidates whose ``applies_to``/``available``/``accepts`` raised."""
    unavailable: dict[str, str] = field(default_factory=dict)
    """Candidates that cannot run on this machine, with their ``available()`` reason."""
    declined: dict[str, str] = field(default_factory=dict)
    """Candidates that turned these inputs down (``accepts()`` or ``Decline``)."""

    def error(self, name: str, text: str) -> None:
        self.passed_over[name] = text
        self.errors[name] = text


def usable(cand: Candidate, region: Region, notes: Notes) -> bool:
    """Whether ``cand`` applies to ``region`` and is available here."""
    try:
        if not cand.applies_to(region):
            notes.passed_over[cand.name] = f"does not apply to {region.describe()}"
            return False
        reason = cand.unavailable_reason()
    except Exception as exc:
        notes.error(cand.name, f"available() raised {exc_text(exc)}")
        return False
    if reason is not None:
        notes.passed_over[cand.name] = f"unavailable: {reason}"
        notes.unavailable[cand.name] = reason
        return False
    return True


def accepting(cand: Candidate, inputs: Sequence[Any], notes: Notes) -> bool:
    """Whether ``cand.accepts(*inputs)``; a ``Decline`` is a no, any other raise an error."""
    try:
        accepted = cand.accepts(*inputs)
    except Decline as dec:
        why = dec.reason
    except Exception as exc:
        notes.error(cand.name, f"accepts() raised {exc_text(exc)}")
        return False
    else:
        if accepted:
            return True
        notes.passed_over[cand.name] = notes.declined[cand.name] = ACCEPTS_FALSE
        return False
    notes.passed_over[cand.name] = f"declined the inputs: {why}"
    notes.declined[cand.name] = why
    return False


def screen(region: Region, candidates: Iterable[Candidate], inputs: Sequence[Any] | None,
           notes: Notes, *, ranked: bool = False) -> list[Candidate]:
    """Candidates that apply, are available and accept ``inputs`` (all inputs when
    None). Highest tier first, unless ``ranked``: a cached ranking keeps its order."""
    ordered = list(candidates) if ranked else sorted(candidates, key=lambda c: (-c.tier, c.name))
    return [c for c in ordered if usable(c, region, notes)
            and (inputs is None or accepting(c, inputs, notes))]


def by_rank(entry: CacheEntry, pool: Sequence[Candidate]) -> list[Candidate]:
    """``pool`` in the entry's ranking order; candidates not ranked follow by tier."""
    rank = {r.name: i for i, r in enumerate(entry.ranking)}
    last = len(rank)
    return sorted(pool, key=lambda c: (rank.get(c.name, last), -c.tier, c.name))
