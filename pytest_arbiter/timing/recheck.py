"""Re-checking a cached winner: is it still the fastest, timed side by side now?

A corpus goes stale without anyone touching it (a library update, a kernel edit, a
runner's clocks). :func:`recheck` times the cached winner against its challengers in
paired, interleaved rounds and flags the key only when a challenger is faster by
more than the tie margin, significant in a one-sided sign test: never against a stored
number, so the machine's drift hits both sides of every comparison alike.

The decision is a sign test of "the winner's time over the challenger's, in the same
round, is above ``1 + margin``" against the null hypothesis that this happens in at
most half the rounds. That null holds for every challenger whose true gap is within
the margin, not only for an exact tie, so the false-alarm rate is at most ``alpha``
per key (``alpha / family`` with a Bonferroni family) whatever the corpus holds. The
verdict is taken once, on all the rounds the budget allowed: the rounds stop early
only when the winner is settled as not stale, which can only lower the false-alarm rate.

The key budget is soft where a verdict needs it: a slow pair (a winner made 45x slower
takes milliseconds a call) goes on past it, up to the hard cap, until it has the rounds
a clear gap needs (:func:`rounds_for_verdict`), so a huge gap is decided in a handful of
rounds instead of getting no verdict.
"""

from __future__ import annotations

import collections
import functools
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_arbiter.timing.measure import ComparePolicy, LatencyStats, Timer, compare_latencies
from pytest_arbiter.timing.pairing import sign_test_p

_BOOKKEEPING = 0.06
"""The share of a key's budget kept for the work after the last round."""


@dataclass(frozen=True)
class RecheckPolicy:
    """How one key is re-timed, and what counts as stale.

    ``key_budget_s`` is the wall time one key's re-timing aims at (warmup, the timed calls
    and the bookkeeping): no round is started past it once the key has the rounds a
    verdict on a clear gap needs (:func:`rounds_for_verdict`, with ``lost_rounds`` of
    them lost to the machine: 14 at the defaults). Until then a slow pair goes on, up
    to ``key_cap_s`` (the hard cap, never below the budget). A challenger is
    faster when the winner is slower by more than ``margin`` (the comparison's tie
    margin) in a one-sided sign test at ``alpha / (family * challengers)``: set
    ``family`` to the number of keys a run re-checks to bound the chance of any false
    alarm in the run (Bonferroni), not only the share of keys. No verdict is taken on
    fewer than ``min_rounds`` paired rounds. The rounds stop early once the winner is
    shown, at ``settle_alpha``, to be within the margin of every challenger (or faster).
    """

    key_budget_s: float = 0.010
    key_cap_s: float = ComparePolicy.cap_s
    lost_rounds: int = 1
    """Rounds a clear gap may lose (a challenger's call preempted) and still be flagged:
    how many rounds the budget buys a slow pair."""
    margin: float = ComparePolicy.tie_margin
    alpha: float = ComparePolicy.alpha
    family: int = 1
    min_rounds: int = 10
    settle_alpha: float = 1e-3
    warmup: int = 2
    max_rounds: int = 1000
    seed: int | None = None
    """The order shuffle's seed; None draws a fresh order per key, so a round-order
    effect is noise to the sign test, never a bias repeated on every key."""
    disable_gc: bool = True
    call_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.key_budget_s > 0:
            raise ValueError(f"key_budget_s must be positive, got {self.key_budget_s}")
        if not 0 < self.alpha < 1 or not 0 < self.settle_alpha < 1:
            raise ValueError(f"alpha and settle_alpha must be in (0, 1), got "
                             f"{self.alpha}, {self.settle_alpha}")
        if self.margin < 0:
            raise ValueError(f"margin must not be negative, got {self.margin}")
        if not self.key_cap_s > 0:
            raise ValueError(f"key_cap_s must be positive, got {self.key_cap_s}")
        if (self.family < 1 or self.min_rounds < 1 or self.warmup < 0
                or self.lost_rounds < 0):
            raise ValueError("family and min_rounds must be at least 1, warmup and "
                             "lost_rounds at least 0")

    @property
    def soft_budget_s(self) -> float:
        """The key budget less the bookkeeping after the last round (ranking and
        summarising ~150 rounds costs ~0.3-0.5 ms in pure Python)."""
        return self.key_budget_s * (1.0 - _BOOKKEEPING)

    @property
    def cap_s(self) -> float:
        """The hard cap less the same bookkeeping: what the rounds may take at most."""
        return max(self.key_cap_s, self.key_budget_s) - self.key_budget_s * _BOOKKEEPING

    def compare_policy(self) -> ComparePolicy:
        """The interleaved comparison's policy: stopped by :func:`recheck`'s own rule
        (the settle test, the soft budget once the rounds suffice) or, before a round that
        would overrun it, by the hard cap; no built-in stop rule."""
        cap = self.cap_s
        return ComparePolicy(warmup=self.warmup, min_rounds=1, max_rounds=self.max_rounds,
                             budget_s=cap, cap_s=cap, alpha=0.0, confident_p=0.0,
                             seed=self.seed, disable_gc=self.disable_gc,
                             call_timeout_s=self.call_timeout_s)


@dataclass(frozen=True)
class RecheckResult:
    """One key's re-check: whether a challenger now beats the cached winner.

    ``ratio`` is the median over rounds of the winner's time over the challenger's in the
    same round (above 1: the winner is slower), and ``p_value`` the one-sided sign test's
    (unadjusted) p-value that the winner is slower by more than the margin; both against
    ``faster`` when there is one, else against the closest challenger. ``timed_ns`` sums
    the timed calls, ``spent_ns`` is the wall time of the whole re-check. ``detail``
    says why no verdict could be taken (a kernel raised, too few rounds fit the budget).
    ``stats`` holds each timed candidate's latencies over the paired rounds (one that
    raised has none): what the pytest-benchmark export charts.
    """

    winner: str
    faster: str | None
    ratio: float
    p_value: float
    rounds: int
    timed_ns: int
    spent_ns: int
    detail: str = ""
    stats: Mapping[str, LatencyStats] = field(default_factory=dict)
    decided: bool = False
    """Whether the re-timing took a verdict: enough paired rounds, and nothing timed
    raised or crawled (a stale finding stands either way)."""

    @property
    def stale(self) -> bool:
        return self.faster is not None

    @property
    def current(self) -> bool:
        """Still the fastest: a verdict was taken, and no challenger beats it."""
        return self.decided and not self.stale

    def to_dict(self) -> dict[str, Any]:
        return {"winner": self.winner, "faster": self.faster, "ratio": self.ratio,
                "p_value": self.p_value, "rounds": self.rounds, "timed_ns": self.timed_ns,
                "spent_ns": self.spent_ns, "detail": self.detail, "decided": self.decided,
                "stats": {name: s.to_dict() for name, s in self.stats.items()}}


@functools.lru_cache(maxsize=8192)
def _critical(trials: int, alpha: float) -> int:
    """The fewest successes of ``trials`` fair coin flips whose one-sided p-value is
    below ``alpha`` (``trials + 1`` when none is)."""
    tail = 0
    whole = 2**trials
    for k in range(trials, -1, -1):
        tail += math.comb(trials, k)
        if tail / whole >= alpha:
            return k + 1
    return 0


def _sign_p(successes: int, trials: int) -> float:
    return sign_test_p(successes, trials)


@functools.lru_cache(maxsize=256)
def rounds_for_verdict(alpha: float, lost: int = 0) -> int:
    """The fewest paired rounds in which a winner slower in all but ``lost`` of them is
    significant at ``alpha`` (one-sided sign test): 10 at 0.001 with none lost, 14 with
    one, 18 with two."""
    if not 0 < alpha < 1 or lost < 0:
        raise ValueError(f"alpha must be in (0, 1) and lost at least 0, got {alpha}, {lost}")
    n = lost + 1
    while _sign_p(n - lost, n) >= alpha:
        n += 1
    return n


class _Tally:
    """Per challenger, over the kept rounds: the winner's paired ratios and how often it
    was slower by more than the margin; and the stop rule. Each round costs
    O(challengers)."""

    def __init__(self, winner: str, others: list[str], pol: RecheckPolicy,
                 started_ns: int) -> None:
        self.winner = winner
        self.others = others
        self.limit = 1.0 + pol.margin
        self.settle_alpha = pol.settle_alpha
        self.min_rounds = pol.min_rounds
        self.enough = max(pol.min_rounds, rounds_for_verdict(
            pol.alpha / (pol.family * len(others)), pol.lost_rounds))
        self.budget_ns = pol.soft_budget_s * 1e9
        self.started_ns = self.last_ns = started_ns
        self.round_ns: collections.deque[float] = collections.deque(maxlen=15)
        self.timed_ns = 0.0
        self.ratios: dict[str, list[float]] = {o: [] for o in others}
        self.slower = dict.fromkeys(others, 0)
        self.rounds = 0

    def add(self, times: Mapping[str, float]) -> bool:
        """Count one round; True stops the rounds (the winner or every challenger gone,
        every challenger settled, or the budget spent once the rounds suffice)."""
        mine = times.get(self.winner)
        if mine is None or len(times) < 2:
            return True
        self.rounds += 1
        n = self.rounds
        settled = n >= self.min_rounds
        need = _critical(n, self.settle_alpha) if settled else 0
        for other in self.others:
            theirs = times.get(other)
            if theirs is None:
                continue
            ratio = mine / theirs if theirs > 0 else math.inf
            self.ratios[other].append(ratio)
            if ratio > self.limit:
                self.slower[other] += 1
            if settled and len(self.ratios[other]) - self.slower[other] < need:
                settled = False
        return settled or self._spent(times)

    def _spent(self, times: Mapping[str, float]) -> bool:
        """Whether the next round would end past the key budget, the rounds sufficing.
        Time is the wall clock's, or the timer's where that is more (a scripted timer's
        calls take no wall time); the first round's wall time would include the warmup,
        so its calls stand for it."""
        now = time.perf_counter_ns()
        took = sum(times.values())
        self.timed_ns += took
        self.round_ns.append(max(float(now - self.last_ns), took) if self.rounds > 1
                             else took)
        self.last_ns = now
        if self.rounds < self.enough:
            return False
        spent = max(float(now - self.started_ns), self.timed_ns)
        # the median of the latest rounds: one preempted round does not stop the rounds,
        # and the cost per round stays bounded
        return spent + 1.5 * statistics.median(self.round_ns) > self.budget_ns


def recheck(winner: str, fns: Mapping[str, Callable[[], Any]], *,
            policy: RecheckPolicy | None = None, timer: Timer | None = None) -> RecheckResult:
    """Re-time the cached ``winner`` against the other entries of ``fns`` (its runner-up,
    candidates marked for re-verification) and say whether one of them is now faster.

    Paired, interleaved rounds in a fresh shuffled order each, through
    :func:`~pytest_arbiter.timing.measure.compare_latencies`; never past the key budget (the
    warmup and one round always run). A challenger that raises or crawls is out; when
    the winner does, there is no verdict (``detail`` says why). Raises ``ValueError``
    when ``winner`` is not in ``fns``.
    """
    if winner not in fns:
        raise ValueError(f"the winner {winner!r} is not among the functions to re-time "
                         f"({', '.join(map(repr, fns)) or 'none'})")
    pol = policy or RecheckPolicy()
    started = time.perf_counter_ns()
    others = [n for n in fns if n != winner]
    if not others:
        return RecheckResult(winner, None, 1.0, 1.0, 0, 0, 0, "nothing to re-time it against")
    tally = _Tally(winner, others, pol, started)
    comparison = compare_latencies(fns, policy=pol.compare_policy(), timer=timer,
                                   on_round=tally.add)
    alpha = pol.alpha / (pol.family * len(others))
    n = tally.rounds
    verdicts: list[tuple[float, float, str]] = []
    for other in others:
        ratios = sorted(tally.ratios[other])
        if not ratios:
            continue
        mid = len(ratios) // 2
        median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
        verdicts.append((median, _sign_p(tally.slower[other], len(ratios)), other))
    details = [f"{name} raised: {why}" for name, why in comparison.failed.items()]
    details += [f"{name} crawled: {why}" for name, why in comparison.dropped.items()]
    if n < pol.min_rounds:
        details.append(f"{n} paired rounds fit the {pol.key_budget_s:g} s budget, "
                       f"{pol.min_rounds} are needed for a verdict")
    faster = None
    if n >= pol.min_rounds:
        stale = [v for v in verdicts if v[1] < alpha and v[0] > 1.0 + pol.margin]
        if stale:
            faster = max(stale, key=lambda v: (v[0], -v[1]))
    closest = faster or max(verdicts, key=lambda v: (v[0], -v[1]), default=None)
    ratio, p_value = (closest[0], closest[1]) if closest is not None else (1.0, 1.0)
    return RecheckResult(winner, faster[2] if faster else None, ratio, p_value, n,
                         round(comparison.timed_ns), time.perf_counter_ns() - started,
                         "; ".join(details), dict(comparison.stats),
                         decided=(n >= pol.min_rounds and not comparison.failed
                                  and not comparison.dropped))


class RunBudget:
    """The run-wide cap on re-check timing, shared by threads.

    Reserve a key's budget with :meth:`take` before re-timing it, then :meth:`settle`
    the reservation with what the re-check spent (``RecheckResult.spent_ns``): the
    unused part comes back, an overrun (a preempted last round) is charged. No re-check
    starts once less than its budget is left.
    """

    def __init__(self, total_s: float) -> None:
        if not total_s >= 0:
            raise ValueError(f"the run budget must not be negative, got {total_s}")
        self._left = float(total_s)
        self._lock = threading.Lock()

    def take(self, seconds: float) -> bool:
        """Reserve ``seconds``; False, reserving nothing, when fewer are left."""
        if seconds < 0:
            raise ValueError(f"cannot take a negative time, got {seconds}")
        with self._lock:
            if seconds > self._left:
                return False
            self._left -= seconds
            return True

    def settle(self, reserved_s: float, spent_s: float) -> None:
        """Replace a reservation of ``reserved_s`` by the ``spent_s`` it cost (never
        leaving less than nothing)."""
        with self._lock:
            self._left = max(0.0, self._left + reserved_s - max(0.0, spent_s))

    @property
    def left_s(self) -> float:
        with self._lock:
            return self._left
