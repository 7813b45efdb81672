"""Latency measurement: warmup, median of N with its spread, and interleaved comparison.

Timers are pluggable: the CPU timer reads a monotonic nanosecond clock; the CUDA lane
brings a CUDA-event timer. A timer times one call of a zero-argument function. Besides
its timer, a comparison reads :class:`Clocks` (wall and CPU time) to budget its rounds.
"""

from __future__ import annotations

import bisect
import gc
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import msgspec

from pytest_arbiter.errors import CallTimeout
from pytest_arbiter.timing.pairing import (
    WinCounts,
    paired_leader,
    paired_ratios,
    ratio_upper,
    stored_ratio,
    wins_needed,
    worst_p,
)
from pytest_arbiter.timing.watchdog import watched_calls


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
class Clocks:
    """The clocks a comparison reads besides its timer, in nanoseconds: ``wall`` bounds
    it by the hard cap; ``cpu``, the timing thread's CPU time, counts against the soft
    budget and finds the preempted rounds (see :class:`ComparePolicy`). ``cpu`` None
    budgets by wall time and keeps every round: for a timer that does not time this
    thread's work (CUDA events time the device while the host thread waits).
    """

    wall: Callable[[], int] = time.perf_counter_ns
    cpu: Callable[[], int] | None = time.thread_time_ns


HOST_CLOCKS = Clocks()
WALL_CLOCKS = Clocks(cpu=None)


def clocks_for(timer: Timer) -> Clocks:
    """The CPU timer's calls run on this thread, so its CPU time is their cost: budget
    by it; any other timer (a device's, a script's) by wall time, as it always was."""
    return HOST_CLOCKS if isinstance(timer, CpuTimer) else WALL_CLOCKS


def relative_spread(median: float, q1: float, q3: float) -> float:
    """The interquartile range relative to the median (0 for a zero median)."""
    return (q3 - q1) / median if median > 0 else 0.0


MAX_FINITE = sys.float_info.max
"""The largest finite float: an artifact's latencies and probabilities are at most this
(a JSON ``1e400`` is infinity and is refused)."""

MAX_SAMPLES = 2**53
"""The most timed calls a row may claim (a JSON number past it is a forged file)."""

MAX_NS = 2**63 - 1
"""The largest whole number of nanoseconds an artifact may hold (292 years)."""

if TYPE_CHECKING:
    Latency = float
else:  # a whole number is written and read as an integer: shorter, and quicker both ways
    Latency = (Annotated[int, msgspec.Meta(ge=0, le=MAX_NS)]
               | Annotated[float, msgspec.Meta(ge=0.0, le=MAX_FINITE)])
"""Nanoseconds: finite and not negative; an ``int`` when whole."""


class LatencyStats(msgspec.Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """The median latency and the spread behind it, in nanoseconds.

    A frozen msgspec struct, untracked by the garbage collector (it holds only numbers),
    so a cache of a million entries adds nothing for the collector to walk. The bounds
    are checked when a cache file is decoded, not when one is built in memory.
    """

    median_ns: Latency
    min_ns: Latency
    q1_ns: Latency
    q3_ns: Latency
    max_ns: Latency
    samples: Annotated[int, msgspec.Meta(ge=1, le=MAX_SAMPLES)]
    """How many timed calls (rounds) the statistics summarise."""

    @classmethod
    def of(cls, samples: Sequence[float]) -> LatencyStats:
        if not samples:
            raise ValueError("no samples to summarise")
        ordered = sorted(samples)
        if len(ordered) >= 2:
            q1, q3 = _quartile(ordered, 1), _quartile(ordered, 3)
        else:
            q1 = q3 = ordered[0]
        return cls(_sorted_median(ordered), ordered[0], q1, q3, ordered[-1], len(ordered))

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return relative_spread(self.median_ns, self.q1_ns, self.q3_ns)

    def whole(self) -> LatencyStats:
        """These statistics with each whole latency an ``int`` (``1217.0`` as ``1217``):
        what a cache file holds."""
        values = (self.median_ns, self.min_ns, self.q1_ns, self.q3_ns, self.max_ns)
        if not any(type(v) is float and v.is_integer() for v in values):
            return self
        return LatencyStats(_whole(self.median_ns), _whole(self.min_ns), _whole(self.q1_ns),
                            _whole(self.q3_ns), _whole(self.max_ns), self.samples)

    def to_dict(self) -> dict[str, float | int]:
        return {"median_ns": self.median_ns, "min_ns": self.min_ns, "q1_ns": self.q1_ns,
                "q3_ns": self.q3_ns, "max_ns": self.max_ns, "samples": self.samples}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyStats:
        return cls(float(data["median_ns"]), float(data["min_ns"]), float(data["q1_ns"]),
                   float(data["q3_ns"]), float(data.get("max_ns", data["q3_ns"])),
                   int(data["samples"]))


def _sorted_median(ordered: Sequence[float]) -> float:
    """``statistics.median`` of data already sorted, by its own formula (no second sort)."""
    half, odd = divmod(len(ordered), 2)
    return ordered[half] if odd else (ordered[half - 1] + ordered[half]) / 2


def _quartile(ordered: Sequence[float], i: int) -> float:
    """The ``i``-th of ``statistics.quantiles(ordered, n=4, method="inclusive")``, by its
    own formula, of at least two sorted values (no copy, no sort)."""
    j, delta = divmod(i * (len(ordered) - 1), 4)
    return (ordered[j] * (4 - delta) + ordered[j + 1] * delta) / 4


def _whole(value: float) -> float:
    # past MAX_NS a file holds the float: as an integer a read would refuse it
    return (int(value) if type(value) is float and value.is_integer() and value <= MAX_NS
            else value)


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
    compared round by round (paired). After ``warmup`` calls each, the rounds stop:

    * on a clear gap: after ``min_rounds``, as soon as the leader beats every other
      candidate in a one-sided sign test at ``alpha``;
    * at the soft budget: after ``min_rounds``, before a round that would take the
      comparison past ``budget_s`` once the pick is confident (its sign test below
      ``confident_p``); a near tie or a slow pair keeps going;
    * at the cap: before a round that would take it past ``cap_s`` (the most one key's
      comparison may cost: ``--arbiter-tune-budget``), or at ``max_rounds``.

    A shared machine preempts: a round in which another process ran is slower by what
    that process got, for whichever candidate it hit. With a CPU clock (the CPU timer:
    :func:`clocks_for`) the soft budget counts the timing thread's CPU time, not wall
    time, and a round is *preempted* when its wall time is over ``preempt_factor`` times
    its CPU time plus ``preempt_slack_s`` (well above clock jitter and an interrupt,
    well below the millisecond slice a CPU-bound neighbour gets): it is discarded and
    timed again, neither evidence nor a cost to the budget. After ``max_discards`` of
    them (a loaded machine, or kernels that wait: sleep, I/O, other threads' work), or
    when a retry would pass the cap, every round is kept and the budget counts wall
    time again. The cap counts wall time throughout.

    There is always one timed round. A tie is evidence of equality, not the want of
    evidence of a gap: the pick's lead is not significant at ``tie_alpha``, the
    runner-up's median paired ratio is under ``1 + tie_margin``, and the rounds bound
    that ratio under ``1 + tie_bound`` at ``tie_alpha`` (a distribution-free bound on a
    median: too few or too noisy rounds bound nothing). Among the candidates that meet
    both, the higher tier is preferred; rounds that bound nothing leave a pick of low
    confidence, never a tie. ``disable_gc`` keeps the cyclic garbage collector out of
    the timed calls.

    Bad kernels are contained: ``call_timeout_s`` arms a per-call watchdog around every
    call (see ``pytest_arbiter.timing.watchdog``); a candidate that raises is out of the
    comparison; a candidate whose fastest call of at least two is over ``crawl_factor``
    times the budget and over ``crawl_factor`` times another's fastest call is a
    crawler, timed no more and ranked last: one slow call (a stall, a preemption, two
    thread pools contending) convicts nobody, so a suspect with one call is timed once
    more at once (unless that call and as long again would pass the cap: then the call
    it made stands). A lone
    candidate needs few rounds (``min_rounds // 2``, at least 3); one left alone beside
    crawlers gets ``min_rounds``, as a ranking of two does.

    A short call feels the call before it: what a neighbour left in the caches and the
    branch predictors (microseconds to refill) speeds or slows it, so a round would time
    each kernel after whichever others the shuffle put before it, and adding a third
    candidate could turn the pick between two (``np.add.accumulate`` of a 2x8 array takes
    0.81 us right after ``np.cumsum``, which shares its code, and 0.93 us first in a
    round, while a numba kernel takes 0.80 us after either). So each candidate whose
    fastest warmup call is under ``lead_in_s`` has each timed call follow an untimed call
    of its own (a lead-in): it is timed as it runs when called again and again, whoever
    else is compared. Longer calls dwarf a neighbour's traces, and a lead-in would
    double what they cost; 0 turns lead-ins off.
    """

    warmup: int = 2
    min_rounds: int = 7
    max_rounds: int = 200
    budget_s: float = 0.01
    cap_s: float = 2.0
    alpha: float = 1e-3
    confident_p: float = 0.01
    tie_alpha: float = 0.01
    tie_margin: float = 0.01
    tie_bound: float = 0.05
    seed: int | None = 0
    disable_gc: bool = True
    call_timeout_s: float | None = None
    crawl_factor: float = 10.0
    preempt_factor: float = 2.0
    preempt_slack_s: float = 50e-6
    max_discards: int = 10
    lead_in_s: float = 100e-6

    def preempted(self, wall_ns: float, cpu_ns: float) -> bool:
        """Whether a timing of ``wall_ns`` on the wall clock that cost ``cpu_ns`` of this
        thread's CPU was preempted: another process ran in it (the rule above)."""
        return wall_ns > self.preempt_factor * cpu_ns + self.preempt_slack_s * 1e9


@dataclass
class Comparison:
    """The outcome of an interleaved comparison: ranking, stats, confidence of the pick.

    ``ratios`` are each candidate's median paired ratio to the pick's time in the same
    round; ``timed_ns`` sums the timed calls (lead-ins too); ``spent_ns`` is the wall
    time of the whole comparison, warmup and bookkeeping included (what the budget
    bounds). ``failed``
    names the candidates that raised (``"Type: message"``): they are in neither the
    ranking nor the stats, and an empty ranking means every candidate failed.
    ``dropped`` names the crawlers and why: ranked last, on the samples they have.
    ``declined`` names the candidates that raised one of the ``declines`` exceptions
    (a kernel handing the work on), with the exception's text: out, like ``failed``.
    ``discarded`` counts the rounds timed again because they were preempted (not in
    ``rounds``; their calls are in ``timed_ns``).
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
    failed: dict[str, str] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    declined: dict[str, str] = field(default_factory=dict)
    discarded: int = 0


def compare_latencies(fns: Mapping[str, Callable[[], object]], *,
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
    contest = _Contest(fns, pol, clock, clocks or clocks_for(clock))
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


_Runner = Callable[[Callable[[Callable[[], object]], float], Callable[[], object]], float]
"""The watchdog's runner (:func:`~pytest_arbiter.timing.watchdog.watched_calls`) as a
comparison calls it: ``run(timer.sample, fn)``, the call's nanoseconds."""


class _Contest:
    """One comparison's state: who is still timed, who failed or crawled, the rounds kept.

    Every call is timed (warmup calls too, so a crawler is caught on its first calls)
    under the watchdog, outside the timer's interval. The bookkeeping stays small beside
    the kernels: pairwise win counts are kept in NumPy as the rounds come in (one
    vectorised update a round, :class:`WinCounts`), the sign test is read from a table of
    the wins it needs, and the kept rounds' times are held sorted for their median.
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
        self.out: set[str] = set()
        """The names no longer in ``alive`` (failed, declined or dropped): a set to test."""
        self.failed: dict[str, str] = {}
        self.declined: dict[str, str] = {}
        self.declines: tuple[type[BaseException], ...] = ()
        self.dropped: dict[str, str] = {}
        self.calls: dict[str, list[float]] = {n: [] for n in self.names}
        self.fastest: dict[str, float] = {}
        self.kept: list[dict[str, float]] = []
        self.summaries: dict[str, LatencyStats] = {}
        self.warm = 0.0
        self.timed = 0.0
        self.lead_in: frozenset[str] = frozenset()
        """The candidates each of whose timed calls in a round follows an untimed call of
        its own: those whose fastest warmup call is under :class:`ComparePolicy`'s
        ``lead_in_s`` (set when the rounds start)."""
        # a call over crawl_factor x the budget may make its candidate a suspect: from
        # the first such call on, each candidate's fastest call is kept and the crawl
        # rule checked after every call (a faster call elsewhere may convict one)
        self.crawl_ns = pol.crawl_factor * pol.budget_s * 1e9
        self.suspects = False
        self.watched: _Runner = lambda sample, fn: sample(fn)
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
        if not pol.preempted(wall, cpu) or self.elapsed() + wall > pol.cap_s * 1e9:
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
        if self.suspects:
            if not self.fastest.get(name, took) < took:  # min, as the builtin picks it
                self.fastest[name] = took
            self._drop_crawlers()
        elif took > self.crawl_ns:
            # the first call over the bound: the fastest calls are kept from here on,
            # and the calls so far give them (no bookkeeping per call while none is)
            self.suspects = True
            self.fastest = {n: min(c) for n, c in self.calls.items() if c}
            self._drop_crawlers()
        return took

    def _timed(self, name: str) -> float | None:
        """One timed call of ``name`` under the watchdog; None, and ``name`` out for good
        (failed, or declined), if it raised."""
        try:
            return self.watched(self.clock.sample, self.fns[name])
        except (Exception, CallTimeout) as exc:
            self.alive.remove(name)
            self.out.add(name)
            if isinstance(exc, self.declines):
                self.declined[name] = str(exc)
            else:
                self.failed[name] = f"{type(exc).__name__}: {exc}"
            return None

    def _timed_again(self, name: str) -> bool:
        """Give a suspect with one call its second, at once; False if it raised (then
        ``name`` is out). Where the second and as long again for the others would pass
        the cap, the call made stands (as a preempted round that cannot be timed again
        is kept)."""
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
        """Stop timing each candidate whose fastest call of at least two (see
        :meth:`_timed_again`) is over ``crawl_factor`` times the budget and over
        ``crawl_factor`` times another live candidate's fastest call: so the fastest
        never goes, nobody does when all are slow, and one slow call convicts nobody."""
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
                self.out.add(name)
                made = len(self.calls[name])
                calls = f"its fastest of {made} calls" if made > 1 else "its one call"
                self.dropped[name] = (
                    f"{calls} took {_human_ns(own)}, over {factor:g}x the "
                    f"{self.pol.budget_s:g} s budget and {factor:g}x another candidate's "
                    f"{_human_ns(min(others))}")

    def run_rounds(self) -> None:
        """Time interleaved rounds into ``kept`` until a stop rule fires."""
        pol = self.pol
        shuffle = random.Random(pol.seed)
        wins = WinCounts(self.names)
        round_times: list[float] = []  # the kept rounds' costs, sorted
        order = list(range(len(self.names)))
        self.lead_in = frozenset(n for n, c in self.calls.items()
                                 if c and min(c) < pol.lead_in_s * 1e9)
        while self.alive:
            if self._enough(wins, round_times):
                break
            round_start = self.wall()
            cpu_start = self.cpu() if self.cpu is not None else 0
            timed_before = self.timed
            shuffle.shuffle(order)
            times = self._round(order)
            if times is None:
                continue
            wall = float(self.wall() - round_start)
            if self.discard(wall, cpu_start):
                continue  # preempted: timed again, as if it never ran
            bisect.insort(round_times, max(wall, self.timed - timed_before))
            self.kept.append(times)
            if self.on_round is not None and self.on_round(times):
                break
            wins.add(times)
            rounds = len(self.kept)
            if pol.alpha > 0 and len(self.alive) > 1 and rounds >= pol.min_rounds:
                needed = wins_needed(rounds, pol.alpha)
                if needed <= rounds and wins.leader_record(self.alive) >= needed:
                    break  # a clear gap

    def _round(self, order: Sequence[int]) -> dict[str, float] | None:
        """Time each live candidate once in ``order``, each after its lead-in where there
        are lead-ins: their times, or None for a void round (a candidate raised, or none
        was left to time). A lead-in's time counts in ``timed``, not in the round's."""
        times: dict[str, float] = {}
        whole = True
        for i in order:
            name = self.names[i]
            if name in self.out:
                continue
            led = self._timed(name) if name in self.lead_in else 0.0
            if led is not None:
                self.timed += led
            took = None if led is None else self.call(name)
            if took is None:
                # a candidate raised: the round is void for everyone
                whole = False
                break
            times[name] = took
        self.timed += sum(times.values())
        return times if whole and times else None

    def _enough(self, wins: WinCounts, round_times: list[float]) -> bool:
        """Whether to stop before the next round (the rules of :class:`ComparePolicy`)."""
        pol, rounds = self.pol, len(self.kept)
        if rounds == 0:
            return False
        # the next round's cost: the median round (so one preempted round does not end
        # the comparison early); before three rounds, the sum of each one's median call
        # (twice for one with a lead-in)
        typical = (_sorted_median(round_times) if len(round_times) >= 3 else
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
        needed = wins_needed(rounds, pol.confident_p)
        return needed <= rounds and wins.leader_record(self.alive) >= needed

    def samples(self, name: str) -> list[float]:
        """The kept rounds' times of ``name``; for a crawler with none, every call it
        made (its warmup call)."""
        kept = [r[name] for r in self.kept if name in r]
        return kept or list(self.calls[name])

    def stats_of(self, name: str) -> LatencyStats:
        """The statistics of :meth:`samples`, summarised once per name: the rounds are
        over when they are asked for."""
        found = self.summaries.get(name)
        if found is None:
            found = self.summaries[name] = LatencyStats.of(self.samples(name))
        return found

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
        stats = {n: self.stats_of(n) for n in ranked + crawlers}
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
        import numpy as np  # here, not at import: reading a corpus needs no NumPy

        # each was timed in every kept round: its samples are its column
        stats = {n: self.stats_of(n) for n in names}
        table = np.array([[r[n] for n in names] for r in self.kept], dtype=np.float64)
        lead = paired_leader(table, [stats[n].median_ns for n in names])
        ratios = dict(zip(names, paired_ratios(table, lead).tolist(), strict=True))
        leader = names[lead]
        # the leader first: where the paired ratios run in a cycle (A beats B, B beats
        # C, C beats A) one of the rest may be under 1, but the pick is what every ratio
        # is to
        rest = sorted((n for n in names if n != leader),
                      key=lambda n: (ratios[n], stats[n].median_ns, -tier_of.get(n, 0), n))
        ranked = [leader, *rest]
        p_worst = worst_p(table, lead)
        pol = self.pol
        upper = dict(zip(names, ratio_upper(table, lead, pol.tie_alpha).tolist(), strict=True))
        tied = [n for n in ranked
                if stored_ratio(ratios[n]) - 1.0 < pol.tie_margin
                and upper[n] - 1.0 < pol.tie_bound]
        tie = p_worst >= pol.tie_alpha and len(tied) > 1
        if tie:
            preferred = max(tied, key=lambda n: (tier_of.get(n, 0), -ranked.index(n)))
            ranked.remove(preferred)
            ranked.insert(0, preferred)
            if preferred != leader:
                ratios = dict(zip(names, paired_ratios(table, names.index(preferred)).tolist(),
                                  strict=True))
        return ranked, ratios, tie, p_worst

    def _ratio_to(self, name: str, pick: str) -> float:
        """``name``'s median ratio to ``pick`` over the rounds both were timed in, or of
        the medians where they share none (a crawler dropped in warmup)."""
        pairs = [r[name] / r[pick] for r in self.kept if name in r and pick in r and r[pick] > 0]
        if pairs:
            return statistics.median(pairs)
        lead = statistics.median(self.samples(pick))
        return statistics.median(self.samples(name)) / lead if lead > 0 else 1.0


def _human_ns(ns: float) -> str:
    """A duration in nanoseconds, in the unit that reads best."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"
