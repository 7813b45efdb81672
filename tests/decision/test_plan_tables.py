"""The memoised plans behind the hot path: a hit reads no version stamp, a change of the
registry or the cache swaps the table, signatures of one key share one plan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter, MeasureCache
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats


def cand(kernel: Callable[..., Any], name: str, tier: int = 0) -> FunctionCandidate:
    return FunctionCandidate(kernel, name, "matmul", "cpu", tier, None, None)


def library(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b)


def other(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.dot(a, b)


class CountingRegistry(CandidateRegistry):
    """A registry that counts reads of its ``generation`` stamp."""

    reads = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "generation":
            CountingRegistry.reads += 1
        return super().__getattribute__(name)


def mats(m: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(m)
    return (rng.standard_normal((m, 8)).astype(np.float32),
            rng.standard_normal((8, 4)).astype(np.float32))


def test_a_hit_reads_no_stamp() -> None:
    reg = CountingRegistry()
    reg.extend([cand(library, "lib")])
    arb = Arbiter(registry=reg, mode="static")
    a, b = mats(4)
    arb.dispatch("matmul", a, b)  # plans
    CountingRegistry.reads = 0
    for _ in range(50):
        arb.dispatch("matmul", a, b)
    assert CountingRegistry.reads == 0
    assert arb.histogram.counts() == {("cpu", "matmul", "lib", "won"): 51}


def test_a_registration_swaps_the_table_and_the_next_dispatch_sees_it() -> None:
    reg = CandidateRegistry()
    reg.extend([cand(library, "lib")])
    arb = Arbiter(registry=reg, mode="static")
    a, b = mats(4)
    arb.dispatch("matmul", a, b)
    table = arb.hot
    reg.add(cand(other, "higher_tier", tier=9))
    assert arb.hot is not table and not arb.hot
    arb.dispatch("matmul", a, b)
    assert arb.histogram.counts() == {("cpu", "matmul", "lib", "won"): 1,
                                      ("cpu", "matmul", "higher_tier", "won"): 1}


def test_a_cache_change_swaps_the_table_and_the_new_winner_runs() -> None:
    reg = CandidateRegistry()
    reg.extend([cand(library, "lib", tier=9), cand(other, "dot")])
    cache = MeasureCache()
    arb = Arbiter(registry=reg, cache=cache, mode="static", gate=True)
    a, b = mats(4)
    arb.dispatch("matmul", a, b)
    key = next(iter(arb.events))
    stats = LatencyStats(1000.0, 900.0, 950.0, 1100.0, 1200.0, 9)
    table = arb.hot
    cache.put(CacheEntry(cpu_device().tag, key.target, key.op, key.bucket, key.dtype,
                         (RankedCandidate("dot", stats),)))
    assert arb.hot is not table
    arb.dispatch("matmul", a, b)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "lib", "won")] == 1
    assert counts[("cpu", "matmul", "dot", "won")] == 1


def test_signatures_of_one_key_share_one_plan() -> None:
    reg = CandidateRegistry()
    reg.extend([cand(library, "lib")])
    arb = Arbiter(registry=reg, mode="static")
    # rows 9..15 fall in one bucket: one key, seven signatures
    for m in range(9, 16):
        arb.dispatch("matmul", *mats(m))
    plans = list(arb.hot.values())
    assert len(plans) == 7
    assert len({id(p) for p in plans}) == len({p.keyplan.key for p in plans}) < 7


def test_an_arbiter_dropped_is_not_kept_alive_by_its_registry() -> None:
    import gc
    import weakref

    reg = CandidateRegistry()
    reg.extend([cand(library, "lib")])
    arb = Arbiter(registry=reg, mode="static")
    gone = weakref.ref(arb)
    del arb
    gc.collect()
    assert gone() is None
    reg.add(cand(other, "dot"))  # a dead listener is skipped


def test_the_public_dispatch_and_the_arbiters_share_one_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``pytest_arbiter.dispatch`` inlines the arbiter's plain hit: it must build the
    same signature, so either call finds the plan the other made, for one input and two;
    and a kernel that raises on the inlined path is recorded as the arbiter records it."""
    import pytest_arbiter
    from pytest_arbiter.decision import process

    reg = CandidateRegistry()
    reg.extend([cand(library, "lib")])
    arb = Arbiter(registry=reg, mode="static")
    monkeypatch.setattr(process, "_current", arb)
    planned: list[object] = []
    real = arb._plan

    def counting(*args: Any) -> Any:
        planned.append(args)
        return real(*args)

    monkeypatch.setattr(arb, "_plan", counting)
    a, b = mats(4)
    arb.dispatch("matmul", a, b)
    pytest_arbiter.dispatch("matmul", a, b)
    pytest_arbiter.dispatch("matmul", a, b.T.copy().T)  # another layout: its own plan
    arb.dispatch("matmul", a, b.T.copy().T)
    assert len(planned) == 2
    assert arb.histogram.counts() == {("cpu", "matmul", "lib", "won"): 4}


def test_a_plan_built_across_a_registration_is_not_kept() -> None:
    """A registration while a signature is being planned (here by the candidate's own
    ``accepts``) resets the tables: the plan built from before it is not remembered,
    so the next dispatch plans again and sees the new candidate."""
    reg = CandidateRegistry()

    def accepts_and_register(a: np.ndarray, b: np.ndarray) -> bool:
        if "late_high" not in {c.name for c in reg.registered()}:
            reg.add(cand(other, "late_high", tier=9))
        return True

    reg.extend([FunctionCandidate(library, "low", "matmul", "cpu", 0, accepts_and_register,
                                  None)])
    arb = Arbiter(registry=reg, mode="static")
    a, b = mats(4)
    arb.dispatch("matmul", a, b)
    arb.dispatch("matmul", a, b)
    counts = arb.histogram.counts()
    assert counts[("cpu", "matmul", "low", "won")] == 1
    assert counts[("cpu", "matmul", "late_high", "won")] == 1


def test_the_gate_keeps_no_inputs_alive_after_a_dispatch() -> None:
    """The gate's trials (the inputs, copies, the reference's results) are shared by a
    key's candidates, then dropped: the caller's arrays are not kept by the arbiter."""
    import gc
    import weakref

    reg = CandidateRegistry()
    reg.extend([cand(library, "lib"), cand(other, "dot", tier=1)])
    arb = Arbiter(registry=reg, mode="static", gate=True)
    a, b = mats(64)
    arb.dispatch("matmul", a, b)
    held = weakref.ref(a)
    del a
    gc.collect()
    assert held() is None
