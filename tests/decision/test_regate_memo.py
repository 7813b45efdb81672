"""Issue 27, point 7, in the arbiter: a candidate rejected for a numerical reason on one
key of an op is gated on every other key of the op, with the failing pattern made for
that key's shapes, before it runs there (a pass held from before is dropped; the gate
off does not skip it); a tuning run measures such a cached leader out; the entry's rows
list the trials each timed candidate passed. Each test fails on the code before point 7
(see the note on each)."""

from __future__ import annotations

import time

import numpy as np

from pytest_arbiter import Arbiter, MeasureCache
from pytest_arbiter.core.ops import OpRegistry, make_op
from pytest_arbiter.decision.states import DispatchKey
from pytest_arbiter.store.cache import CacheEntry
from tests.factories import FAST, fn, lse_naive, lse_ref, lse_shifted, registry_of

OP = "t27p7_lse"
ALL_DERIVED = ("own", "fresh", "large_magnitude", "large_offset", "special")


def lse_slow(x: np.ndarray) -> np.ndarray:
    """The correct kernel, slower than the naive one: the naive one wins wherever it
    passes the gate."""
    time.sleep(0.0003)
    return lse_shifted(x)


def _arbiter(mode: str = "tune", cache: MeasureCache | None = None,
             gate: bool = True) -> Arbiter:
    ops = OpRegistry()
    ops.register(make_op(OP, lse_ref))
    reg = registry_of(fn(lse_naive, "naive", OP, tier=5), fn(lse_slow, "shifted", OP, tier=1))
    return Arbiter(registry=reg, ops=ops, mode=mode, policy=FAST, cache=cache, gate=gate)


def _ordinary() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((8, 300)).astype(np.float32)


def _grid() -> np.ndarray:
    """Logits on a coarse grid: its key's own derived trials keep them as they are."""
    return np.random.default_rng(3).integers(-3, 3, (16, 64)).astype(np.float32)


def _key(arb: Arbiter, x: np.ndarray) -> DispatchKey:
    region = arb.ops.get(OP).region_of(x)
    return DispatchKey("cpu", OP, region.bucket(), region.dtype)


def _entry(arb: Arbiter, x: np.ndarray) -> CacheEntry:
    bucket = _key(arb, x).bucket
    found = [e for e in arb.cache.entries() if e.bucket == bucket]
    assert len(found) == 1
    return found[0]


def test_a_kernel_rejected_for_overflow_on_one_key_is_rejected_on_another() -> None:
    """Before: the naive kernel passed the grid key's own gate (its logits never get
    large) and won it, after it had been rejected for overflow on the first key."""
    arb = _arbiter()
    arb.dispatch(OP, _ordinary())
    arb.dispatch(OP, _grid())
    counts = arb.histogram.counts()
    assert counts[("cpu", OP, "naive", "rejected")] == 2
    assert ("cpu", OP, "naive", "won") not in counts
    grid = _entry(arb, _grid())
    assert grid.winner == "shifted"
    row = grid.considered["naive"]
    assert row.outcome == "rejected" and "another key of the op" in row.reason
    assert "large_magnitude pattern first failed it on bucket 8x512" in row.reason
    # the entry's rows list the trials each timed candidate passed
    assert grid.considered["shifted"].trials == ("own",)
    assert _entry(arb, _ordinary()).considered["shifted"].trials == ALL_DERIVED


def test_a_pass_held_from_before_the_rejection_is_gated_again() -> None:
    """Before: the naive kernel, measured the winner of the grid key first, kept winning
    it after it failed on the other key."""
    arb = _arbiter()
    arb.dispatch(OP, _grid())
    assert _entry(arb, _grid()).winner == "naive"
    arb.dispatch(OP, _ordinary())
    arb.dispatch(OP, _grid())
    counts = arb.histogram.counts()
    assert counts[("cpu", OP, "naive", "won")] == 1  # the first dispatch, before it failed
    assert counts[("cpu", OP, "shifted", "won")] == 2
    grid = _entry(arb, _grid())  # measured again: the new entry supersedes the old
    assert grid.winner == "shifted" and grid.considered["naive"].outcome == "rejected"
    assert arb.gates.suspect(_key(arb, _grid()), arb.registry.get("naive"))


def test_the_gate_off_does_not_skip_a_kernel_rejected_on_another_key() -> None:
    """Before: with the gate off, the corpus vouched for the naive kernel on the grid key
    and it ran there, after the gate had rejected it for overflow on another key."""
    tuned = _arbiter()
    tuned.dispatch(OP, _grid())
    assert _entry(tuned, _grid()).winner == "naive"
    production = _arbiter("static", tuned.cache, gate=False)
    production.dispatch(OP, _grid())  # vouched for: runs ungated
    assert production.histogram.counts()[("cpu", OP, "naive", "won")] == 1
    production.dispatch(OP, _ordinary())  # no entry here: gated, rejected
    production.dispatch(OP, _grid())  # the plan that ran it ungated is gone
    counts = production.histogram.counts()
    assert counts[("cpu", OP, "naive", "rejected")] == 2
    assert counts[("cpu", OP, "naive", "won")] == 1


def test_a_correct_kernel_and_a_non_numerical_rejection_carry_nothing() -> None:
    """No false rejects: the correct kernel is never re-gated; a kernel rejected for
    another reason (its output's shape) is not carried to other keys either."""
    arb = _arbiter()
    arb.dispatch(OP, _ordinary())
    arb.dispatch(OP, _grid())
    shifted = arb.registry.get("shifted")
    for x in (_ordinary(), _grid()):
        key = _key(arb, x)
        assert not arb.gates.suspect(key, shifted) and arb.gates.regate(key, shifted) == ()
    assert arb.histogram.counts()[("cpu", OP, "shifted", "won")] == 2
    gates = arb.gates
    wrong_shape = fn(lambda x: lse_shifted(x)[:-1], "short", OP)
    key = DispatchKey("cpu", OP, "elsewhere", "float32")
    assert gates.verdict(arb.ops.get(OP), key, wrong_shape, (_ordinary(),)).kind == "reject"
    assert ("cpu", OP, "short") not in gates.failures
    assert not gates.suspect(_key(arb, _grid()), wrong_shape)


def test_one_pattern_failing_on_many_keys_is_regated_once() -> None:
    """The same kind of pattern failing a kernel on several keys (each with its own scale)
    adds one re-gated trial on the next key, not one per key it failed on."""
    arb = _arbiter(mode="static")
    naive = arb.registry.get("naive")
    for rows in (8, 16, 32):  # three keys where the naive kernel overflows
        x = np.random.default_rng(rows).standard_normal((rows, 300)).astype(np.float32)
        arb.dispatch(OP, x)
    failed_on = {f.key for f in arb.gates.failures.get(("cpu", OP, "naive"), ())}
    assert len(failed_on) >= 2
    other = DispatchKey("cpu", OP, "elsewhere", "float32")
    patterns = arb.gates.regate(other, naive)
    assert len(patterns) == len({(p.kind, p.input) for p in patterns}) >= 1
