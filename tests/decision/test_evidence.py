"""Evidence before a winner: a low-confidence pick is measured again by the next tune
(once per process), and strict mode neither accepts it nor asks to tune a key whose
every candidate fails the gate."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from pytest_arbiter import Arbiter, CacheMiss, ComparePolicy, LowConfidence, MeasureCache
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.ops import OpRegistry, make_op
from pytest_arbiter.store.cache import CacheEntry


def quick(x: np.ndarray) -> np.ndarray:
    return x * 2


def slower(x: np.ndarray) -> np.ndarray:
    y = x * 2
    for _ in range(30):
        y = x * 2
    return y


def wrong(x: np.ndarray) -> np.ndarray:
    return x * 3


def setup(*kernels: tuple[object, str]) -> tuple[CandidateRegistry, OpRegistry]:
    ops = OpRegistry()
    ops.register(make_op("ev_twice", lambda x: x * 2))
    reg = CandidateRegistry()
    reg.extend(FunctionCandidate(k, name, "ev_twice", "cpu", 0, None, None)  # type: ignore[arg-type]
               for k, name in kernels)
    return reg, ops


def test_the_next_tune_measures_a_low_confidence_pick_again_once() -> None:
    reg, ops = setup((quick, "quick"), (slower, "slower"))
    cache = MeasureCache()
    x = np.arange(256.0)
    one_round = ComparePolicy(min_rounds=1, max_rounds=1)
    Arbiter(registry=reg, ops=ops, cache=cache, mode="tune", policy=one_round).dispatch(
        "ev_twice", x)
    (low,) = cache.entries()
    assert low.low_confidence and low.provenance.rounds == 1
    strict = Arbiter(registry=reg, ops=ops, cache=cache, mode="strict")
    with pytest.raises(LowConfidence, match="low-confidence"):
        strict.dispatch("ev_twice", x)

    tuner = Arbiter(registry=reg, ops=ops, cache=cache, mode="tune",
                    policy=ComparePolicy(min_rounds=7, max_rounds=60))
    for n in (256, 240, 224):  # new signatures of the key: planned again, measured once
        tuner.dispatch("ev_twice", np.arange(float(n)))
    (again,) = cache.entries()
    assert again.provenance.rounds >= 7 and not again.low_confidence
    assert again.winner == "quick"


def test_strict_mode_does_not_ask_to_tune_a_key_whose_every_candidate_fails() -> None:
    reg, ops = setup((wrong, "wrong"))
    arb = Arbiter(registry=reg, ops=ops, cache=MeasureCache(), mode="strict")
    x = np.arange(16.0)
    np.testing.assert_allclose(arb.dispatch("ev_twice", x), x * 2)
    assert arb.histogram.counts() == {("cpu", "ev_twice", "wrong", "rejected"): 1}
    reg.add(FunctionCandidate(quick, "quick", "ev_twice", "cpu", 0, None, None))
    with pytest.raises(CacheMiss, match="no cached winner"):
        arb.dispatch("ev_twice", x)


def test_low_confidence_is_read_from_the_entry() -> None:
    reg, ops = setup((quick, "quick"), (slower, "slower"))
    cache = MeasureCache()
    Arbiter(registry=reg, ops=ops, cache=cache, mode="tune",
            policy=ComparePolicy(min_rounds=7, max_rounds=60)).dispatch(
        "ev_twice", np.arange(256.0))
    (entry,) = cache.entries()
    assert not entry.low_confidence
    assert msgspec.structs.replace(entry, confidence=0.9).low_confidence
    assert not msgspec.structs.replace(entry, confidence=0.9, tie=True).low_confidence


def test_a_measured_entry_records_each_timed_rows_paired_ratio() -> None:
    """Every row timed in the entry's comparison carries its paired ratio to the winner
    (1.0 for the winner), in ranking order; a carried row has none."""
    reg, ops = setup((quick, "quick"), (slower, "slower"))
    cache = MeasureCache()
    Arbiter(registry=reg, ops=ops, cache=cache, mode="tune").dispatch(
        "ev_twice", np.arange(256.0))
    (entry,) = cache.entries()
    ratios = [row.ratio for row in entry.ranking]
    assert ratios[0] == 1.0 and all(r is not None and r > 1.0 for r in ratios[1:])
    assert [entry.over_winner(row) for row in entry.ranking] == ratios
    carried = msgspec.structs.replace(entry.ranking[1], carried=True)
    with pytest.raises(ValueError, match="a carried row has no paired ratio"):
        CacheEntry(entry.device, entry.target, entry.op, entry.bucket, entry.dtype,
                   (entry.ranking[0], carried), entry.confidence)
