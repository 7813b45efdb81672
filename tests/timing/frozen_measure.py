"""A frozen reference: the interleaved comparison's round logic as it was before its
bookkeeping was made cheap (the win matrix kept in Python, the sign test computed at
every check, the round times' median sorted afresh each round).

Do not edit or "fix" this module: ``test_rounds_differential.py`` drives it and
:func:`pytest_arbiter.timing.measure.compare_latencies` with the same scripted calls
and clocks, and every field of the two comparisons must agree. Only the types, the
clocks and ``LatencyStats`` are imported from the package (``test_rounds_differential``
checks ``LatencyStats.of`` against ``statistics`` on its own), and the watchdog's runner,
whose call now takes ``(fn, arg)``. Changed since it was frozen: that line, and one rule
made in both (a crawler is convicted on its fastest call of at least two: a suspect
with one call is timed once more first, room under the cap permitting:
``_timed_again``), and a second (where the fastest warmup call is under the policy's
``lead_in_s``, each timed call in a round follows an untimed call of its own, counted in
``timed`` and in the round's cost).
"""

from __future__ import annotations

import gc
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence

from pytest_arbiter.errors import CallTimeout
from pytest_arbiter.timing.measure import (
    CPU_TIMER,
    Clocks,
    ComparePolicy,
    Comparison,
    LatencyStats,
    Timer,
    clocks_for,
)
from pytest_arbiter.timing.watchdog import watched_calls


def _sign_test_p(wins: int, trials: int) -> float:
    """One-sided p-value that ``wins`` of ``trials`` paired rounds arose by chance."""
    if trials == 0:
        return 1.0
    total = 0
    for i in range(wins, trials + 1):
        total += math.comb(trials, i)
    return total / 2.0**trials


def frozen_compare_latencies(fns: Mapping[str, Callable[[], object]], *,
                      tiers: Mapping[str, int] | None = None,
                      policy: ComparePolicy | None = None,
                      timer: Timer | None = None,
                      on_round: Callable[[Mapping[str, float]], bool] | None = None,
                      declines: tuple[type[BaseException], ...] = (),
                      clocks: Clocks | None = None) -> Comparison:
    """Rank zero-argument functions by latency with interleaved, adaptively stopped rounds.

    The ranking follows each candidate's median paired ratio to the leader (its time
    over the leader's in the same round), which cancels what a round's neighbours did
    to both; ``confidence`` is one minus the sign test's p-value of the pick against
    the closest other candidate. A candidate that raises is left out (``failed``) and
    a crawler is ranked last (``dropped``); this never raises for a kernel's sake.
    ``on_round`` sees each kept round's times (name to nanoseconds) and stops the
    rounds by returning True: a caller's own stop rule (an ``alpha`` of 0 turns the
    built-in one off); the budget still bounds the rounds. ``declines``: exception
    types that mean "not for these inputs" rather than a failure (``Comparison.declined``).
    ``clocks``: the wall and CPU clocks that budget the rounds (:func:`clocks_for` the
    timer unless given: a test scripts them).
    """
    if not fns:
        raise ValueError("nothing to compare")
    pol = policy or ComparePolicy()
    clock = timer or CPU_TIMER
    contest = _FrozenContest(fns, pol, clock, clocks or clocks_for(clock))
    contest.on_round = on_round
    contest.declines = declines
    gc_was_enabled = gc.isenabled()
    if pol.disable_gc:
        gc.disable()
    try:
        with watched_calls(pol.call_timeout_s) as watched:
            contest.watched = watched
            # warm up in the rounds' own interleaved pattern, so the caches and the
            # memory allocator reach the state the timed rounds will see
            for done in range(pol.warmup):
                if done and contest.warm > pol.budget_s * 1e9:
                    break  # slow kernels: one warmup call each is enough
                for name in contest.names:
                    if name in contest.alive and contest.elapsed() <= pol.cap_s * 1e9:
                        contest.warm += contest.call(name) or 0.0
            contest.run_rounds()
    finally:
        if gc_was_enabled:
            gc.enable()
    return contest.outcome(dict(tiers or {}))


class _FrozenContest:
    """One comparison's state: who is still timed, who failed or crawled, the rounds kept.

    Every call is timed (warmup calls too, so a crawler is caught on its first call)
    under the watchdog, outside the timer's interval. Pairwise win counts are kept as
    the rounds come in, so the per-round stop test costs O(candidates^2), not
    O(rounds): the bookkeeping stays small beside the budget.
    """

    def __init__(self, fns: Mapping[str, Callable[[], object]], pol: ComparePolicy,
                 clock: Timer, clocks: Clocks) -> None:
        self.fns = fns
        self.pol = pol
        self.clock = clock
        self.wall, self.cpu = clocks.wall, clocks.cpu
        self.started = self.wall()
        self.cpu_started = self.cpu() if self.cpu is not None else 0
        self.discarded = 0
        self.discarded_cpu = 0
        self.names = list(fns)
        self.alive = list(self.names)
        self.lead_in: set[str] = set()
        self.failed: dict[str, str] = {}
        self.declined: dict[str, str] = {}
        self.declines: tuple[type[BaseException], ...] = ()
        self.dropped: dict[str, str] = {}
        self.calls: dict[str, list[float]] = {n: [] for n in self.names}
        self.fastest: dict[str, float] = {}
        self.kept: list[dict[str, float]] = []
        self.warm = 0.0
        self.timed = 0.0
        # a call over crawl_factor x the budget makes its candidate a suspect, checked
        # after every later call too (a faster call elsewhere may convict it)
        self.crawl_ns = pol.crawl_factor * pol.budget_s * 1e9
        self.suspects = False
        self.watched: Callable[..., float] = lambda f, arg: f(arg)
        self.on_round: Callable[[Mapping[str, float]], bool] | None = None

    def elapsed(self) -> float:
        """Nanoseconds spent: the wall clock, or the timer's total where that is more
        (a scripted timer's calls take no wall time)."""
        return max(float(self.wall() - self.started), self.warm + self.timed)

    def judging(self) -> bool:
        """Whether rounds are still judged for preemption and budgeted by CPU time."""
        return self.cpu is not None and self.discarded < self.pol.max_discards

    def budget_spent(self) -> float:
        """Nanoseconds counted against the soft budget: this thread's CPU time less the
        discarded rounds' while rounds are judged, else :meth:`elapsed`."""
        if self.cpu is None or not self.judging():
            return self.elapsed()
        return float(self.cpu() - self.cpu_started - self.discarded_cpu)

    def discard(self, wall: float, cpu_start: int) -> bool:
        """Whether the round just timed, of ``wall`` nanoseconds, was preempted and is
        discarded: judged, over the :class:`ComparePolicy` rule, and a retry as long
        would still fit under the cap."""
        if self.cpu is None or not self.judging():
            return False
        cpu = self.cpu() - cpu_start
        pol = self.pol
        if (wall <= pol.preempt_factor * cpu + pol.preempt_slack_s * 1e9
                or self.elapsed() + wall > pol.cap_s * 1e9):
            return False
        self.discarded += 1
        self.discarded_cpu += cpu
        return True

    def call(self, name: str) -> float | None:
        """Time one call of ``name``; None, and ``name`` out for good, if it raised."""
        took = self._timed(name)
        if took is None:
            return None
        self.calls[name].append(took)
        self.fastest[name] = min(took, self.fastest.get(name, took))
        if took > self.crawl_ns:
            self.suspects = True
        if self.suspects:
            self._drop_crawlers()
        return took

    def _timed(self, name: str) -> float | None:
        try:
            # changed since it was frozen: the runner takes (fn, arg)
            return self.watched(self.clock.sample, self.fns[name])
        except (Exception, CallTimeout) as exc:
            self.alive.remove(name)
            if isinstance(exc, self.declines):
                self.declined[name] = str(exc)
            else:
                self.failed[name] = f"{type(exc).__name__}: {exc}"
            return None

    def _timed_again(self, name: str) -> bool:
        """The rule made in both: a suspect's second call, room under the cap permitting."""
        if self.elapsed() + 2 * self.fastest[name] > self.pol.cap_s * 1e9:
            return True
        again = self._timed(name)
        if again is None:
            return False
        self.calls[name].append(again)
        self.timed += again
        self.fastest[name] = min(again, self.fastest[name])
        return True

    def _drop_crawlers(self) -> None:
        """Stop timing each candidate whose fastest call (of two, room permitting) is
        over ``crawl_factor`` times the budget and over ``crawl_factor`` times another
        live candidate's fastest call (so the fastest never goes, and nobody does when
        all are slow)."""
        factor = self.pol.crawl_factor
        for name in sorted(self.alive, key=lambda n: -self.fastest.get(n, 0.0)):
            if self.fastest.get(name, 0.0) <= self.crawl_ns:
                break
            others = [self.fastest[o] for o in self.alive if o != name and o in self.fastest]
            if not others or self.fastest[name] <= factor * min(others):
                continue
            if len(self.calls[name]) < 2 and not self._timed_again(name):
                continue
            own = self.fastest[name]
            if own > self.crawl_ns and own > factor * min(others):
                self.alive.remove(name)
                made = len(self.calls[name])
                calls = f"its fastest of {made} calls" if made > 1 else "its one call"
                self.dropped[name] = (f"{calls} took {_human_ns(own)}, over {factor:g}x "
                                      f"the {self.pol.budget_s:g} s budget and {factor:g}x "
                                      f"another candidate's {_human_ns(min(others))}")

    def run_rounds(self) -> None:
        """Time interleaved rounds into ``kept`` until a stop rule fires."""
        pol = self.pol
        shuffle = random.Random(pol.seed)
        index = {n: i for i, n in enumerate(self.names)}
        wins = [[0] * len(self.names) for _ in self.names]
        round_times: list[float] = []
        order = list(range(len(self.names)))
        # made in both: a lead-in for each candidate whose fastest warmup call is short
        lead_in = {n for n, c in self.calls.items() if c and min(c) < pol.lead_in_s * 1e9}
        self.lead_in = lead_in
        while self.alive:
            if self._enough(wins, index, round_times):
                break
            round_start = self.wall()
            cpu_start = self.cpu() if self.cpu is not None else 0
            timed_before = self.timed
            shuffle.shuffle(order)
            times: dict[str, float] = {}
            whole = True
            for i in order:
                name = self.names[i]
                if name not in self.alive:
                    continue
                if name in lead_in:
                    led = self._timed(name)
                    if led is None:
                        whole = False
                        break
                    self.timed += led
                took = self.call(name)
                if took is None:
                    # a candidate raised: the round is void for everyone
                    whole = False
                    break
                times[name] = took
            self.timed += sum(times.values())
            if not whole or not times:
                continue
            wall = float(self.wall() - round_start)
            if self.discard(wall, cpu_start):
                continue  # preempted: timed again, as if it never ran
            round_times.append(max(wall, self.timed - timed_before))
            self.kept.append(times)
            if self.on_round is not None and self.on_round(times):
                break
            for a, ta in times.items():
                row = wins[index[a]]
                for b, tb in times.items():
                    if ta < tb:
                        row[index[b]] += 1
            live = [index[n] for n in self.alive]
            if (pol.alpha > 0 and len(live) > 1 and len(self.kept) >= pol.min_rounds
                    and _leader_p(wins, live, len(self.kept)) < pol.alpha):
                break  # a clear gap

    def _enough(self, wins: list[list[int]], index: Mapping[str, int],
                round_times: list[float]) -> bool:
        """Whether to stop before the next round (the rules of :class:`ComparePolicy`)."""
        pol, rounds = self.pol, len(self.kept)
        if rounds == 0:
            return False
        # the next round's cost: the median round (so one preempted round does not end
        # the comparison early); before three rounds, the sum of each one's median call
        typical = (statistics.median(round_times) if len(round_times) >= 3 else
                   sum(statistics.median(self.calls[n]) * (2 if n in self.lead_in else 1)
                       for n in self.alive))
        spent = self.elapsed()
        if spent + 1.5 * typical > pol.cap_s * 1e9:
            return True
        if len(self.alive) == 1:
            # a lone candidate is the pick whatever it measures: a few samples do; beside
            # crawlers, as many as a ranking of two needs (or the entry is low-confidence)
            return rounds >= (pol.min_rounds if self.dropped else max(3, pol.min_rounds // 2))
        if rounds >= max(1, pol.max_rounds):
            return True
        if (rounds < pol.min_rounds
                or self.budget_spent() + 3.0 * typical <= pol.budget_s * 1e9):
            return False
        live = [index[n] for n in self.alive]
        return _leader_p(wins, live, rounds) < pol.confident_p

    def samples(self, name: str) -> list[float]:
        """The kept rounds' times of ``name``; for a crawler with none, every call it
        made (its warmup call)."""
        kept = [r[name] for r in self.kept if name in r]
        return kept or list(self.calls[name])

    def outcome(self, tier_of: Mapping[str, int]) -> Comparison:
        """Rank the finishers as the rounds say, then the crawlers after them."""
        spent = float(self.wall() - self.started)
        rounds = len(self.kept)
        finishers = [n for n in self.names if n in self.alive]
        crawlers = [n for n in self.names if n in self.dropped]
        ratios: dict[str, float] = {}
        if not finishers and len(crawlers) > 1:
            # crawlers only, the rest failed: no common rounds, so the medians rank them
            medians = {n: statistics.median(self.samples(n)) for n in crawlers}
            ranked = sorted(crawlers, key=lambda n: (medians[n], -tier_of.get(n, 0), n))
            crawlers, confidence, tie, p_worst = [], 0.0, False, 1.0
        elif len(finishers) <= 1:
            if not finishers and not crawlers:
                return Comparison([], {}, 0.0, False, rounds, self.timed, {}, spent, 1.0,
                                  dict(self.failed), dict(self.dropped), dict(self.declined),
                                  self.discarded)
            # one candidate left (a lone crawler only if all else failed): the pick, as
            # when there is one candidate from the start
            ranked = finishers or crawlers
            crawlers = [n for n in crawlers if n not in ranked]
            confidence, tie, p_worst = 1.0, False, 0.0
        else:
            ranked, ratios, tie, p_worst = self._rank(finishers, tier_of)
            confidence = 1.0 - p_worst
        stats = {n: LatencyStats.of(self.samples(n)) for n in ranked + crawlers}
        pick = ranked[0]
        for n in ranked + crawlers:
            if n not in ratios:
                ratios[n] = self._ratio_to(n, pick)
        crawlers.sort(key=lambda n: (ratios[n], stats[n].median_ns, -tier_of.get(n, 0), n))
        return Comparison(ranked + crawlers, stats, confidence, tie, rounds, self.timed,
                          ratios, spent, p_worst, dict(self.failed), dict(self.dropped),
                          dict(self.declined), self.discarded)

    def _rank(self, names: list[str], tier_of: Mapping[str, int]
              ) -> tuple[list[str], dict[str, float], bool, float]:
        """The paired-ratio ranking of candidates timed in every kept round, the tie rule
        applied: ranking, ratios to the pick, tie, the sign test's worst p-value."""
        samples = {n: [r[n] for r in self.kept] for n in names}
        stats = {n: LatencyStats.of(samples[n]) for n in names}
        leader = _paired_leader(names, samples)
        ratios = {n: _paired_ratio(samples[n], samples[leader]) for n in names}
        rest = sorted((n for n in names if n != leader),
                      key=lambda n: (ratios[n], stats[n].median_ns, -tier_of.get(n, 0), n))
        ranked = [leader, *rest]
        p_worst = _worst_p(leader, names, samples)
        pol = self.pol
        tied = [n for n in ranked if float(f"{ratios[n]:.4g}") - 1.0 < pol.tie_margin
                and _ratio_upper(samples[n], samples[leader], pol.tie_alpha) - 1.0
                < pol.tie_bound]
        tie = p_worst >= pol.tie_alpha and len(tied) > 1
        if tie:
            preferred = max(tied, key=lambda n: (tier_of.get(n, 0), -ranked.index(n)))
            ranked.remove(preferred)
            ranked.insert(0, preferred)
            if preferred != leader:
                ratios = {n: _paired_ratio(samples[n], samples[preferred]) for n in names}
        return ranked, ratios, tie, p_worst

    def _ratio_to(self, name: str, pick: str) -> float:
        """``name``'s median ratio to ``pick`` over the rounds both were timed in, or of
        the medians where they share none (a crawler dropped in warmup)."""
        pairs = [r[name] / r[pick] for r in self.kept if name in r and pick in r and r[pick] > 0]
        if pairs:
            return statistics.median(pairs)
        lead = statistics.median(self.samples(pick))
        return statistics.median(self.samples(name)) / lead if lead > 0 else 1.0


def _leader_p(wins: list[list[int]], live: list[int], rounds: int) -> float:
    """The sign test's p-value of the candidate whose weakest pairwise record is best,
    against its closest competitor."""
    weakest = max(min(wins[i][j] for j in live if j != i) for i in live)
    return _sign_test_p(weakest, rounds)


def _human_ns(ns: float) -> str:
    """A duration in nanoseconds, in the unit that reads best."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def _paired_leader(names: Sequence[str], samples: Mapping[str, Sequence[float]]) -> str:
    """The candidate that no other beats on the median paired ratio."""
    leader = min(names, key=lambda n: statistics.median(samples[n]))
    for _ in range(len(names)):
        challenger = min(names, key=lambda n: _paired_ratio(samples[n], samples[leader]))
        if challenger == leader or _paired_ratio(samples[challenger], samples[leader]) >= 1.0:
            return leader
        leader = challenger
    return leader


def _paired_ratio(mine: Sequence[float], leader: Sequence[float]) -> float:
    """Median over rounds of my time over the leader's time in the same round."""
    pairs = [m / lead for m, lead in zip(mine, leader, strict=True) if lead > 0]
    return statistics.median(pairs) if pairs else 1.0


def _ratio_upper(mine: Sequence[float], leader: Sequence[float], below: float) -> float:
    """The paired ratios' ``k``-th largest, ``k`` the largest rank at which the median is
    below it with probability at least ``1 - below`` (binomial tail); infinite with none."""
    pairs = sorted(m / lead for m, lead in zip(mine, leader, strict=True) if lead > 0)
    n, k, tail = len(pairs), 0, 0
    while k < n:
        tail += math.comb(n, k)
        if tail / 2**n > below:
            break
        k += 1
    return pairs[n - k] if k else math.inf


def _worst_p(leader: str, names: Sequence[str], samples: Mapping[str, Sequence[float]]) -> float:
    """The sign test's p-value of ``leader`` against its closest competitor."""
    worst = 0.0
    lead = samples[leader]
    for other in names:
        if other == leader:
            continue
        wins = sum(1 for a, b in zip(lead, samples[other], strict=True) if a < b)
        worst = max(worst, _sign_test_p(wins, len(lead)))
    return worst
