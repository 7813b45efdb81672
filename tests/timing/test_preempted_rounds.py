"""A preempted round is timed again: neither evidence nor a cost to the soft budget.

The comparison reads a wall clock and a CPU clock (``Clocks``); here both are scripted,
advanced only by the timer's calls, so the tests count rounds instead of timing anything.
A call "preempted" takes ten times its CPU time on the wall clock, and reports that wall
time, as the CPU timer would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from pytest_arbiter.timing.measure import (
    Clocks,
    ComparePolicy,
    Comparison,
    CpuTimer,
    compare_latencies,
)

MS = 1_000_000


class ScriptedMachine:
    """Each candidate's call takes its scripted CPU nanoseconds; the calls numbered in
    ``preempted`` (1-based over all calls, warmup included) take ``slowdown`` times as
    long on the wall clock, and the timer reports the wall time."""

    def __init__(self, cpu_ns: dict[str, int], preempted: Collection[int] = (),
                 slowdown: int = 10) -> None:
        self.cpu_ns = cpu_ns
        self.preempted = preempted
        self.slowdown = slowdown
        self.wall_now = 0
        self.cpu_now = 0
        self.calls = 0
        self.last = ""

    def fns(self) -> dict[str, Callable[[], object]]:
        def make(name: str) -> Callable[[], object]:
            def run() -> None:
                self.last = name

            return run

        return {n: make(n) for n in self.cpu_ns}

    def sample(self, fn: Callable[[], object]) -> float:
        fn()
        self.calls += 1
        cpu = self.cpu_ns[self.last]
        wall = cpu * (self.slowdown if self.calls in self.preempted else 1)
        self.cpu_now += cpu
        self.wall_now += wall
        return float(wall)

    def clocks(self) -> Clocks:
        return Clocks(wall=lambda: self.wall_now, cpu=lambda: self.cpu_now)


# a budget, not the sign test, ends these comparisons (alpha 0 turns the sign test off)
POLICY = ComparePolicy(warmup=2, min_rounds=7, max_rounds=200, budget_s=0.04, cap_s=2.0,
                       alpha=0.0)
SPEEDS = {"fast": 1 * MS, "slow": 11 * MS // 10}


def run(machine: ScriptedMachine, policy: ComparePolicy = POLICY) -> Comparison:
    return compare_latencies(machine.fns(), policy=policy, timer=machine,
                             clocks=machine.clocks())


def test_a_preempted_round_is_discarded_and_the_budget_stops_where_it_would_have() -> None:
    """Round 5's first call (call 13: after 4 warmup calls and 4 rounds of 2) runs at 10x
    wall over CPU: that round is timed again, kept nowhere, counted as discarded, and the
    rounds stop at the same count, on the same ranking, as on a quiet machine."""
    quiet = run(ScriptedMachine(SPEEDS))
    loaded = run(ScriptedMachine(SPEEDS, preempted={13}))
    assert quiet.discarded == 0 and loaded.discarded == 1
    assert loaded.rounds == quiet.rounds > POLICY.min_rounds  # the budget stopped both
    assert loaded.ranking == quiet.ranking == ["fast", "slow"]
    # the 10x call is in no kept sample: every kept time is a scripted CPU time
    for name, stats in loaded.stats.items():
        assert stats.max_ns == stats.min_ns == SPEEDS[name]
        assert stats.samples == loaded.rounds
    assert loaded.ratios == quiet.ratios
    # its calls were made and timed all the same
    assert loaded.timed_ns > quiet.timed_ns


def test_the_rule_keeps_a_round_at_1_5x_its_cpu_time_and_discards_one_at_2_5x() -> None:
    """The rule's edge, wall over 2x CPU plus 50 us: round 5 (1 ms and 1.1 ms of CPU)
    with one call at 2x wall is about 1.5x its CPU time and kept; at 4x, over 2.4x and
    discarded."""
    for slowdown, discarded in ((4, 1), (2, 0)):
        comp = run(ScriptedMachine(SPEEDS, preempted={13}, slowdown=slowdown))
        assert comp.discarded == discarded


def test_a_machine_where_every_round_looks_preempted_still_finishes_within_the_cap() -> None:
    """Every call at 10x: ``max_discards`` rounds are timed again, then every round is
    kept and the budget counts wall time; the cap bounds the wall time throughout."""
    slow_machine = ScriptedMachine(SPEEDS, preempted=range(1, 10_000))
    comp = run(slow_machine, ComparePolicy(warmup=2, min_rounds=7, budget_s=0.04,
                                           cap_s=2.0, alpha=0.0, max_discards=5))
    assert comp.discarded == 5
    assert comp.ranking == ["fast", "slow"]
    assert comp.rounds >= 7 and comp.spent_ns <= 2.0e9
    # a cap that leaves room for a few rounds only: no retry would fit past it
    tight = ComparePolicy(warmup=2, min_rounds=7, budget_s=0.04, cap_s=0.15, alpha=0.0)
    capped = run(ScriptedMachine(SPEEDS, preempted=range(1, 10_000)), tight)
    assert capped.spent_ns <= tight.cap_s * 1e9
    assert capped.rounds >= 1 and capped.discarded < tight.max_discards
    assert capped.ranking[0] == "fast"


def test_a_timer_other_than_the_cpu_timer_keeps_every_round() -> None:
    """A device's timer (CUDA events) times while the host thread waits, so a round's
    wall time over its CPU time says nothing there: with the default clocks, a timer that
    is not the CPU timer keeps its rounds even when its calls only sleep."""

    class WaitingTimer:
        def sample(self, fn: Callable[[], object]) -> float:
            fn()
            return 1000.0

    fns: dict[str, Callable[[], object]] = {n: lambda: time.sleep(0.001) for n in "ab"}
    policy = ComparePolicy(warmup=1, min_rounds=3, max_rounds=3)
    assert compare_latencies(fns, policy=policy, timer=WaitingTimer()).discarded == 0
    # the CPU timer on the same sleeping calls sees every round preempted, up to the limit
    comp = compare_latencies(fns, policy=policy, timer=CpuTimer())
    assert comp.discarded == policy.max_discards and comp.rounds == 3


def test_max_discards_zero_keeps_the_old_rule() -> None:
    """No discards allowed: the preempted round is kept, as every round once was."""
    policy = ComparePolicy(warmup=2, min_rounds=7, budget_s=0.04, alpha=0.0, max_discards=0)
    comp = run(ScriptedMachine(SPEEDS, preempted={13}), policy)
    assert comp.discarded == 0
    assert any(stats.max_ns == 10 * SPEEDS[n] for n, stats in comp.stats.items())
