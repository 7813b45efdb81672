"""Latency measurement: warmup, median of N with its spread, and interleaved comparison.

Timers are pluggable: the CPU timer reads a monotonic nanosecond clock; the CUDA lane
brings a CUDA-event timer. A timer times one call of a zero-argument function.
"""

from __future__ import annotations

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
        return (self.q3_ns - self.q1_ns) / self.median_ns if self.median_ns > 0 else 0.0

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
    """How long to compare candidates and when to stop early.

    Candidates run interleaved (every round times each once, in a shuffled order), so
    slow drifts of a shared machine hit all of them alike. After ``min_rounds`` the
    comparison stops as soon as the leader beats every other candidate in a one-sided
    sign test at ``alpha``, or when ``budget_s`` of timing or ``max_rounds`` is spent.
    A difference smaller than ``tie_margin`` that the test cannot resolve is a tie.
    """

    warmup: int = 2
    min_rounds: int = 7
    max_rounds: int = 200
    budget_s: float = 0.01
    alpha: float = 1e-3
    tie_margin: float = 0.01
    seed: int | None = 0


@dataclass
class Comparison:
    """The outcome of an interleaved comparison: ranking, stats, confidence of the pick."""

    ranking: list[str]
    stats: dict[str, LatencyStats]
    confidence: float
    tie: bool
    rounds: int
    timed_ns: float
    ratios: dict[str, float] = field(default_factory=dict)


def _sign_test_p(wins: int, trials: int) -> float:
    """One-sided p-value that ``wins`` of ``trials`` paired rounds arose by chance."""
    if trials == 0:
        return 1.0
    total = 0.0
    for i in range(wins, trials + 1):
        total += math.comb(trials, i)
    return total / 2.0**trials


def compare_latencies(fns: Mapping[str, Callable[[], object]], *,
                      tiers: Mapping[str, int] | None = None,
                      policy: ComparePolicy | None = None,
                      timer: Timer | None = None) -> Comparison:
    """Rank zero-argument functions by latency with interleaved, adaptively stopped rounds."""
    if not fns:
        raise ValueError("nothing to compare")
    pol = policy or ComparePolicy()
    clock = timer or CPU_TIMER
    names = list(fns)
    tier_of = dict(tiers or {})
    samples: dict[str, list[float]] = {n: [] for n in names}
    for name in names:
        for _ in range(pol.warmup):
            fns[name]()
    if len(names) == 1:
        only = names[0]
        for _ in range(max(3, pol.min_rounds // 2)):
            samples[only].append(clock.sample(fns[only]))
        return Comparison([only], {only: LatencyStats.of(samples[only])}, 1.0, False,
                          len(samples[only]), sum(samples[only]))
    shuffle = random.Random(pol.seed)
    budget_ns = pol.budget_s * 1e9
    timed = 0.0
    rounds = 0
    p_worst = 1.0
    while rounds < pol.max_rounds:
        order = names[:]
        shuffle.shuffle(order)
        for name in order:
            t = clock.sample(fns[name])
            samples[name].append(t)
            timed += t
        rounds += 1
        if rounds >= pol.min_rounds:
            leader = min(names, key=lambda n: statistics.median(samples[n]))
            p_worst = _worst_p(leader, names, samples)
            if p_worst < pol.alpha or timed >= budget_ns:
                break
    stats = {n: LatencyStats.of(samples[n]) for n in names}
    ranked = sorted(names, key=lambda n: (stats[n].median_ns, -tier_of.get(n, 0), n))
    leader = ranked[0]
    p_worst = _worst_p(leader, names, samples)
    ratios = {n: _paired_ratio(samples[n], samples[leader]) for n in names}
    runner_up = ranked[1]
    tie = p_worst >= pol.alpha and ratios[runner_up] - 1.0 < pol.tie_margin
    if tie:
        tied = [n for n in ranked if ratios[n] - 1.0 < pol.tie_margin]
        preferred = max(tied, key=lambda n: (tier_of.get(n, 0), -ranked.index(n)))
        ranked.remove(preferred)
        ranked.insert(0, preferred)
    return Comparison(ranked, stats, 1.0 - p_worst, tie, rounds, timed, ratios)


def _paired_ratio(mine: Sequence[float], leader: Sequence[float]) -> float:
    """Median over rounds of my time over the leader's time in the same round."""
    pairs = [m / lead for m, lead in zip(mine, leader, strict=True) if lead > 0]
    return statistics.median(pairs) if pairs else 1.0


def _worst_p(leader: str, names: Sequence[str], samples: Mapping[str, Sequence[float]]) -> float:
    worst = 0.0
    lead = samples[leader]
    for other in names:
        if other == leader:
            continue
        wins = sum(1 for a, b in zip(lead, samples[other], strict=True) if a < b)
        worst = max(worst, _sign_test_p(wins, len(lead)))
    return worst
