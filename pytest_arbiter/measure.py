"""Latency measurement: warmup, median of N with its spread, and interleaved comparison.

Timers are pluggable: the CPU timer reads a monotonic nanosecond clock; the CUDA lane
brings a CUDA-event timer. A timer times one call of a zero-argument function.
"""

from __future__ import annotations

import gc
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class Timer(Protocol):
    """Times one call of ``fn`` and returns nanoseconds."""

    def sample(self, fn: Callable[[], object]) -> float: ...


class CpuTimer:
    """Wall time of one call on the monotonic nanosecond clock."""

    def sample(self, fn: Callable[[], object]) -> float:
        clock = time.perf_counter_ns
        start = clock()
        fn()
        return float(clock() - start)


CPU_TIMER = CpuTimer()


def relative_spread(median: float, q1: float, q3: float) -> float:
    """The interquartile range relative to the median (0 for a zero median)."""
    return (q3 - q1) / median if median > 0 else 0.0


@dataclass(frozen=True)
class LatencyStats:
    """The median latency and the spread behind it, in nanoseconds."""

    median_ns: float
    min_ns: float
    q1_ns: float
    q3_ns: float
    max_ns: float
    samples: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> LatencyStats:
        if not samples:
            raise ValueError("no samples to summarise")
        ordered = sorted(samples)
        if len(ordered) >= 2:
            q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
        else:
            q1 = q3 = ordered[0]
        return cls(statistics.median(ordered), ordered[0], q1, q3, ordered[-1], len(ordered))

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return relative_spread(self.median_ns, self.q1_ns, self.q3_ns)

    def to_dict(self) -> dict[str, float | int]:
        return {"median_ns": self.median_ns, "min_ns": self.min_ns, "q1_ns": self.q1_ns,
                "q3_ns": self.q3_ns, "max_ns": self.max_ns, "samples": self.samples}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyStats:
        return cls(float(data["median_ns"]), float(data["min_ns"]), float(data["q1_ns"]),
                   float(data["q3_ns"]), float(data.get("max_ns", data["q3_ns"])),
                   int(data["samples"]))


def measure_latency(fn: Callable[..., object], *args: Any, warmup: int = 3, repeat: int = 25,
                    timer: Timer | None = None) -> LatencyStats:
    """Call ``fn(*args)`` ``warmup`` times untimed, then time ``repeat`` calls."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    if warmup < 0:
        raise ValueError(f"warmup must be non-negative, got {warmup}")
    clock = timer or CPU_TIMER

    def call() -> object:
        return fn(*args)

    for _ in range(warmup):
        call()
    return LatencyStats.of([clock.sample(call) for _ in range(repeat)])


@dataclass(frozen=True)
class ComparePolicy:
    """How long to compare candidates, when to stop early, and what counts as a tie.

    Candidates run interleaved: every round times each once, in a shuffled order, so
    the slow drifts and bursts of a shared machine hit all of them alike, and they are
    compared round by round (paired). After ``warmup`` untimed calls each, and at least
    ``min_rounds`` rounds, the comparison stops as soon as the leader beats every other
    candidate in a one-sided sign test at ``alpha``, or before a round that would take
    it past ``budget_s`` (wall time of the whole comparison, warmup included), or at
    ``max_rounds``. A pick that the rounds do not support at ``tie_alpha`` and that is
    ahead by less than ``tie_margin`` is a tie: the higher tier is preferred.
    ``disable_gc`` keeps the cyclic garbage collector out of the timed calls.
    """

    warmup: int = 2
    min_rounds: int = 7
    max_rounds: int = 200
    budget_s: float = 0.01
    alpha: float = 1e-3
    tie_alpha: float = 0.05
    tie_margin: float = 0.01
    seed: int | None = 0
    disable_gc: bool = True


@dataclass
class Comparison:
    """The outcome of an interleaved comparison: ranking, stats, confidence of the pick.

    ``ratios`` are each candidate's median paired ratio to the pick's time in the same
    round; ``timed_ns`` sums the timed calls; ``spent_ns`` is the wall time of the whole
    comparison, warmup and bookkeeping included (what the budget bounds).
    """

    ranking: list[str]
    stats: dict[str, LatencyStats]
    confidence: float
    tie: bool
    rounds: int
    timed_ns: float
    ratios: dict[str, float] = field(default_factory=dict)
    spent_ns: float = 0.0
    p_value: float = 1.0


def _sign_test_p(wins: int, trials: int) -> float:
    """One-sided p-value that ``wins`` of ``trials`` paired rounds arose by chance."""
    if trials == 0:
        return 1.0
    total = 0
    for i in range(wins, trials + 1):
        total += math.comb(trials, i)
    return total / 2.0**trials


def compare_latencies(fns: Mapping[str, Callable[[], object]], *,
                      tiers: Mapping[str, int] | None = None,
                      policy: ComparePolicy | None = None,
                      timer: Timer | None = None) -> Comparison:
    """Rank zero-argument functions by latency with interleaved, adaptively stopped rounds.

    The ranking follows each candidate's median paired ratio to the leader (its time
    over the leader's in the same round), which cancels what a round's neighbours did
    to both; ``confidence`` is one minus the sign test's p-value of the pick against
    the closest other candidate.
    """
    if not fns:
        raise ValueError("nothing to compare")
    pol = policy or ComparePolicy()
    clock = timer or CPU_TIMER
    wall = time.perf_counter_ns
    started = wall()
    names = list(fns)
    tier_of = dict(tiers or {})
    samples: dict[str, list[float]] = {n: [] for n in names}
    gc_was_enabled = gc.isenabled()
    if pol.disable_gc:
        gc.disable()
    try:
        # warm up in the rounds' own interleaved pattern, so the caches and the memory
        # allocator reach the state the timed rounds will see
        for _ in range(pol.warmup):
            for name in names:
                fns[name]()
        if len(names) == 1:
            only = names[0]
            for _ in range(max(3, pol.min_rounds // 2)):
                samples[only].append(clock.sample(fns[only]))
            return Comparison([only], {only: LatencyStats.of(samples[only])}, 1.0, False,
                              len(samples[only]), sum(samples[only]),
                              {only: 1.0}, float(wall() - started), 0.0)
        rounds, timed = _run_rounds(fns, names, samples, pol, clock, started)
    finally:
        if gc_was_enabled:
            gc.enable()
    spent = float(wall() - started)
    stats = {n: LatencyStats.of(samples[n]) for n in names}
    leader = _paired_leader(names, samples)
    ratios = {n: _paired_ratio(samples[n], samples[leader]) for n in names}
    ranked = sorted(names, key=lambda n: (ratios[n], stats[n].median_ns, -tier_of.get(n, 0), n))
    p_worst = _worst_p(leader, names, samples)
    runner_up = ranked[1]
    tie = p_worst >= pol.tie_alpha and ratios[runner_up] - 1.0 < pol.tie_margin
    if tie:
        tied = [n for n in ranked if ratios[n] - 1.0 < pol.tie_margin]
        preferred = max(tied, key=lambda n: (tier_of.get(n, 0), -ranked.index(n)))
        ranked.remove(preferred)
        ranked.insert(0, preferred)
        if preferred != leader:
            ratios = {n: _paired_ratio(samples[n], samples[preferred]) for n in names}
    return Comparison(ranked, stats, 1.0 - p_worst, tie, rounds, timed, ratios, spent, p_worst)


def _run_rounds(fns: Mapping[str, Callable[[], object]], names: list[str],
                samples: dict[str, list[float]], pol: ComparePolicy, clock: Timer,
                started: int) -> tuple[int, float]:
    """Time interleaved rounds into ``samples`` until a stop rule fires.

    Pairwise win counts are kept as the rounds come in, so the per-round stop test
    costs O(candidates^2), not O(rounds): the bookkeeping stays small beside the budget.
    """
    shuffle = random.Random(pol.seed)
    wall = time.perf_counter_ns
    budget_ns = pol.budget_s * 1e9
    count = len(names)
    wins = [[0] * count for _ in range(count)]
    timed = 0.0
    rounds = 0
    round_times: list[float] = []
    order = list(range(count))
    while rounds < pol.max_rounds:
        if rounds >= pol.min_rounds:
            # stop before a round that could overrun the budget, not after it: three
            # typical rounds (the median, so one preempted round does not end it early)
            # leave room for a slower round and the final bookkeeping
            typical = statistics.median(round_times)
            if max(float(wall() - started), timed) + 3.0 * typical > budget_ns:
                break
        round_start = wall()
        shuffle.shuffle(order)
        times = [0.0] * count
        for i in order:
            times[i] = clock.sample(fns[names[i]])
        round_times.append(max(float(wall() - round_start), sum(times)))
        for i in range(count):
            samples[names[i]].append(times[i])
            row = wins[i]
            for j in range(count):
                if times[i] < times[j]:
                    row[j] += 1
        timed += sum(times)
        rounds += 1
        if rounds >= pol.min_rounds:
            # the candidate whose weakest pairwise record is best leads; stop when even
            # that weakest record is significant
            weakest = max(min(w for j, w in enumerate(row) if j != i)
                          for i, row in enumerate(wins))
            if _sign_test_p(weakest, rounds) < pol.alpha:
                break
    return rounds, timed


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
