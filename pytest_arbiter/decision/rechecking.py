"""Re-timing a cached winner against its runner-up in a run (``--arbiter-recheck``):
once per key and process, within the run's recheck budget."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.regions import Region
from pytest_arbiter.decision.gating import Verdict
from pytest_arbiter.decision.screen import Notes, accepting, usable
from pytest_arbiter.decision.states import RecheckStatus
from pytest_arbiter.decision.timers import timer_for
from pytest_arbiter.extend.device import lock_identity
from pytest_arbiter.store.cache import CacheEntry, CacheKey
from pytest_arbiter.timing.device_lock import measurement_lock
from pytest_arbiter.timing.recheck import RecheckPolicy, RecheckResult, RunBudget, recheck


class Rechecker:
    """The run's recheck policy and budget, and what each key's re-timing found."""

    def __init__(self, policy: RecheckPolicy | None, budget: RunBudget | None) -> None:
        self.policy = policy
        self.budget = budget
        self.results: dict[CacheKey, RecheckResult | None] = {}
        """Each key re-timed: its result; None when the run's budget was spent first."""
        self._reserved: set[CacheKey] = set()
        self._lock = threading.Lock()

    def reserve(self, ckey: CacheKey) -> bool:
        """Whether this thread re-times ``ckey``: once per key and process."""
        if self.policy is None:
            return False
        with self._lock:
            if ckey in self._reserved:
                return False
            self._reserved.add(ckey)
            return True

    def run(self, ckey: CacheKey, entry: CacheEntry, pool: Sequence[Candidate],
            region: Region, inputs: Sequence[Any],
            verdict: Callable[[Candidate], Verdict]) -> RecheckResult | None:
        """Re-time the cached leader against the runner-up on these inputs (both gated
        first); None when there is nothing to re-time it against or no input to time."""
        assert self.policy is not None
        pair = _pair(entry, pool, region, inputs, verdict)
        if len(pair) < 2:
            return None
        budget = self.budget
        if budget is not None and not budget.take(self.policy.key_budget_s):
            self.results[ckey] = None
            return None
        try:
            fns = {c.name: functools.partial(c.run, *c.prepare_inputs(*inputs)) for c in pair}
        except Exception:
            return None  # the dispatch's own path records what is wrong with it
        with measurement_lock(lock_identity(ckey.device)):
            result = recheck(pair[0].name, fns, policy=self.policy,
                             timer=timer_for(ckey.target))
        if budget is not None:
            budget.settle(self.policy.key_budget_s, result.spent_ns / 1e9)
        self.results[ckey] = result
        return result


def _pair(entry: CacheEntry, pool: Sequence[Candidate], region: Region,
          inputs: Sequence[Any], verdict: Callable[[Candidate], Verdict]) -> list[Candidate]:
    """The cached winner and the next cached candidate that can run the inputs and
    pass the gate; empty when the winner itself cannot (unavailable, declining, rejected):
    a re-timing that leaves the winner out cannot call it stale."""
    by_name = {c.name: c for c in pool}
    pair: list[Candidate] = []
    for row in entry.ranking:
        cand = by_name.get(row.name)
        if (cand is None or not usable(cand, region, Notes())
                or not accepting(cand, inputs, Notes()) or verdict(cand).kind != "pass"):
            if not pair:
                return []
            continue
        pair.append(cand)
        if len(pair) == 2:
            break
    return pair


def status_of(result: RecheckResult | None) -> RecheckStatus:
    if result is None:
        return "not_retimed"
    if result.stale:
        return "stale"
    return "current" if result.current else "no_verdict"


def recheck_text(result: RecheckResult | None) -> str:
    """One line, for people: what the re-timing of a cached winner found."""
    if result is None:
        return "not re-timed: the run's recheck budget was spent"
    if result.stale:
        return (f"stale: the cached winner {result.winner} now takes {result.ratio:.3g}x "
                f"the time of {result.faster} (sign test p={result.p_value:.2g}, "
                f"{result.rounds} paired rounds)")
    if not result.current:
        return f"no verdict on {result.winner}: {result.detail}"
    return (f"current: {result.winner} is still the fastest ({result.rounds} paired "
            f"rounds, ratio {result.ratio:.3g})")
