"""The comparison's cheap bookkeeping decides as the old one did.

``compare_latencies`` keeps its pairwise wins in NumPy and checks the sign test only
when its outcome can change; ``frozen_measure.frozen_compare_latencies`` is the round
logic before that (a Python win matrix, the stop rule computed every round). Both are
driven with the same scripted calls and clocks (times with ties, candidates that raise,
decline or crawl, preempted rounds, every stop rule), and every field of the two
comparisons must agree, as must the sequence of calls made (the stop point).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from hypothesis import HealthCheck, given, settings, strategies as st

from pytest_arbiter.timing.measure import (
    Clocks,
    ComparePolicy,
    Comparison,
    LatencyStats,
    compare_latencies,
)
from tests.timing.frozen_measure import frozen_compare_latencies


class Declined(Exception):
    """A scripted kernel's "not for these inputs"."""


@dataclass(frozen=True)
class Script:
    """Each candidate's call ``k`` (0-based, warmup included) takes ``times[name][k %
    len]`` CPU nanoseconds; the calls numbered in ``preempted`` (0-based over all calls)
    take ``slowdown`` times that on the wall clock, which the timer reports. A name in
    ``raise_on`` raises on that call of its own (a ``Declined`` where ``declines``)."""

    times: Mapping[str, tuple[int, ...]]
    raise_on: Mapping[str, int]
    declines: frozenset[str]
    preempted: frozenset[int]
    slowdown: int


class Machine:
    """A scripted timer with its own wall and CPU clocks, and a log of the calls made."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.wall_now = 0
        self.cpu_now = 0
        self.log: list[str] = []
        self.made = dict.fromkeys(script.times, 0)
        self.last = ""

    def fns(self) -> dict[str, Callable[[], object]]:
        def make(name: str) -> Callable[[], object]:
            def run() -> None:
                self.last = name
                self.log.append(name)
                self.made[name] += 1
                if self.made[name] - 1 == self.script.raise_on.get(name):
                    kind = Declined if name in self.script.declines else RuntimeError
                    raise kind(f"{name} on call {self.made[name]}")

            return run

        return {n: make(n) for n in self.script.times}

    def sample(self, fn: Callable[[], object]) -> float:
        fn()
        own = self.script.times[self.last]
        cpu = own[(self.made[self.last] - 1) % len(own)]
        slow = self.script.slowdown if len(self.log) - 1 in self.script.preempted else 1
        self.cpu_now += cpu
        self.wall_now += cpu * slow
        return float(cpu * slow)

    def clocks(self, cpu: bool) -> Clocks:
        return Clocks(wall=lambda: self.wall_now, cpu=(lambda: self.cpu_now) if cpu else None)


US = 1_000
# small and large scales: ties, clear gaps, and (rarer) calls past the crawl threshold
SCALES = st.sampled_from([1, 100, 1 * US, 1 * US, 50 * US, 50 * US, 1_000 * US, 200_000 * US])


@st.composite
def scripts(draw: st.DrawFn, scales: st.SearchStrategy[int] = SCALES,
            slowdowns: Sequence[int] = (2, 3, 10, 100, 1000)) -> Script:
    count = draw(st.integers(1, 7))
    names = [f"k{i}" for i in range(count)]
    times = {}
    for name in names:
        scale = draw(scales)
        steps = draw(st.lists(st.integers(0, 12), min_size=1, max_size=40))
        times[name] = tuple(scale * (10 + s) if scale > 1 else s for s in steps)
    raisers = draw(st.lists(st.sampled_from(names), unique=True, max_size=2))
    raise_on = {n: draw(st.integers(0, 30)) for n in raisers}
    declines = frozenset(draw(st.lists(st.sampled_from(names), unique=True, max_size=1)))
    preempted = frozenset(draw(st.lists(st.integers(0, 150), max_size=20)))
    slowdown = draw(st.sampled_from(slowdowns))
    return Script(times, raise_on, declines, preempted, slowdown)


@st.composite
def policies(draw: st.DrawFn) -> ComparePolicy:
    return ComparePolicy(
        warmup=draw(st.integers(0, 3)),
        min_rounds=draw(st.integers(0, 14)),
        max_rounds=draw(st.integers(0, 80)),
        budget_s=draw(st.sampled_from([1e-6, 1e-4, 1e-3, 0.01, 0.04, 1.0, 1.0, 1.0])),
        cap_s=draw(st.sampled_from([1e-5, 0.01, 0.2, 2.0, float("inf")])),
        alpha=draw(st.sampled_from([0.0, 1e-3, 0.05, 0.5])),
        confident_p=draw(st.sampled_from([0.0, 0.01, 0.2, 1.0])),
        tie_alpha=draw(st.sampled_from([0.01, 0.5])),
        tie_margin=draw(st.sampled_from([0.0, 0.01, 0.3])),
        tie_bound=draw(st.sampled_from([0.0, 0.05, 0.5, float("inf")])),
        seed=draw(st.sampled_from([0, 1, 7])),  # None: a random order, by design
        disable_gc=False,
        call_timeout_s=draw(st.sampled_from([None, 60.0])),
        crawl_factor=draw(st.sampled_from([2.0, 10.0])),
        max_discards=draw(st.integers(0, 4)),
        lead_in_s=draw(st.sampled_from([0.0, 1e-6, 100e-6, 1.0])),
    )


def _run(compare: Callable[..., Comparison], script: Script, policy: ComparePolicy,
         cpu: bool, stop_after: int | None, tiers: Mapping[str, int]
         ) -> tuple[dict[str, object], list[str]]:
    machine = Machine(script)
    seen: list[Mapping[str, float]] = []

    def on_round(times: Mapping[str, float]) -> bool:
        seen.append(dict(times))
        return stop_after is not None and len(seen) >= stop_after

    comparison = compare(machine.fns(), tiers=tiers, policy=policy, timer=machine,
                         on_round=on_round, declines=(Declined,),
                         clocks=machine.clocks(cpu))
    fields = asdict(comparison)
    fields["seen rounds"] = seen
    return fields, machine.log


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(script=scripts(), policy=policies(), cpu=st.booleans(),
       stop_after=st.none() | st.integers(1, 20), tiers=st.dictionaries(
           st.sampled_from([f"k{i}" for i in range(7)]), st.integers(0, 2), max_size=4))
def test_the_cheap_bookkeeping_decides_as_the_frozen_round_logic(
        script: Script, policy: ComparePolicy, cpu: bool, stop_after: int | None,
        tiers: dict[str, int]) -> None:
    """Same ranking, ratios, stats, confidence, tie, p-value, rounds, discards, failures,
    declines, crawlers, spent and timed nanoseconds, rounds seen, and calls made."""
    new, new_log = _run(compare_latencies, script, policy, cpu, stop_after, tiers)
    old, old_log = _run(frozen_compare_latencies, script, policy, cpu, stop_after, tiers)
    assert new_log == old_log
    assert new == old


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(script=scripts(st.sampled_from([1 * US, 50 * US]), (100, 1000)), policy=policies(),
       budget_s=st.floats(1e-5, 0.05))
def test_preempted_rounds_are_discarded_as_the_frozen_round_logic_discards_them(
        script: Script, policy: ComparePolicy, budget_s: float) -> None:
    """Calls of microseconds preempted at 100x or more, on the CPU clock, no cap in the
    way, any budget: rounds discarded and timed again, the same ones in both, and the
    budget's stop at the same round (a discarded round's time in no estimate)."""
    policy = replace(policy, cap_s=float("inf"), budget_s=budget_s,
                     max_discards=max(1, policy.max_discards))
    new = _run(compare_latencies, script, policy, True, None, {})
    old = _run(frozen_compare_latencies, script, policy, True, None, {})
    assert new == old


def test_many_candidates_and_long_comparisons_decide_as_the_frozen_round_logic() -> None:
    """Sixteen candidates, two hundred rounds, near ties: the win counts over many rounds
    and the stop rules at every round count agree."""
    for seed in range(12):
        times = {f"k{i}": tuple(1000 + ((i * 37 + c * (seed + 11)) % (50 + seed * 9))
                                for c in range(97)) for i in range(16)}
        # three calls preempted at 200x: their rounds discarded and timed again
        script = Script(times, {}, frozenset(), frozenset({40, 41, 300}), 200)
        policy = ComparePolicy(min_rounds=7, max_rounds=200, budget_s=1.0, cap_s=10.0,
                               alpha=1e-3 if seed % 2 else 0.0, confident_p=0.01,
                               disable_gc=False, seed=seed)
        new = _run(compare_latencies, script, policy, True, None, {})
        old = _run(frozen_compare_latencies, script, policy, True, None, {})
        assert new == old
        assert new[0]["discarded"] >= 1


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(0, 10**12) | st.floats(0, 1e12, allow_nan=False), min_size=1,
                max_size=60))
def test_latency_stats_are_the_statistics_modules_median_and_quartiles(
        samples: list[float]) -> None:
    """``LatencyStats.of`` sorts once and applies ``statistics``' own formulas: the same
    median and inclusive quartiles, bit for bit."""
    got = LatencyStats.of(samples)
    if len(samples) >= 2:
        q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    else:
        q1 = q3 = samples[0]
    want = (statistics.median(samples), min(samples), q1, q3, max(samples), len(samples))
    assert (got.median_ns, got.min_ns, got.q1_ns, got.q3_ns, got.max_ns, got.samples) == want
    assert [type(v) for v in want[:5]] == [type(v) for v in (got.median_ns, got.min_ns,
                                                              got.q1_ns, got.q3_ns, got.max_ns)]


def test_a_burst_of_preempted_rounds_stays_out_of_the_next_rounds_cost() -> None:
    """Three quiet rounds, then rounds 4 to 7 preempted at 1000x: discarded, their wall
    time in no estimate of the next round's cost, so the budget stops both at the same
    round (later than it would if the burst counted)."""
    times = {"fast": (1 * US,), "slow": (2 * US,)}
    script = Script(times, {}, frozenset(), frozenset(range(6, 14)), 1000)
    policy = ComparePolicy(warmup=0, min_rounds=1, max_rounds=50, budget_s=30e-6,
                           cap_s=float("inf"), alpha=0.0, confident_p=1.0,
                           disable_gc=False, crawl_factor=1e6, max_discards=10)
    new = _run(compare_latencies, script, policy, True, None, {})
    old = _run(frozen_compare_latencies, script, policy, True, None, {})
    assert new == old
    assert new[0]["discarded"] == 4 and new[0]["rounds"] > 3
