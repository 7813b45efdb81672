"""The F4 gate's work that no candidate changes is done once per key: the trials, the
reference's results and the budgets are shared by the candidates gated on the same
inputs, and a built-in op's trials on a region alone are kept for the next gates on it;
an output's bits are judged once per trial, whichever candidates return them; a
kernel that writes its inputs is still caught, bit for bit, at any size; and the watchdog
still stops a hanging call, its handler installed once per gate."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import SoftmaxRegion, f4_gate
from pytest_arbiter.core.candidates import Candidate, CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.gate import GATE_SEED
from pytest_arbiter.core.ops import OPS, Op, make_op
from pytest_arbiter.decision.gating import GateMemo
from pytest_arbiter.decision.states import DispatchKey
from pytest_arbiter.decision.tuning import measured_arbitrate
from pytest_arbiter.store.cache import MeasureCache


def cand(fn: Callable[..., Any], op: str, name: str | None = None) -> FunctionCandidate:
    return FunctionCandidate(fn, name or fn.__name__, op, "cpu", 0, None, None)


class Counting:
    """A user op's reference (``x * 2`` in float64) that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(x, dtype=np.float64) * 2.0


def twice(x: np.ndarray) -> np.ndarray:
    return x * np.float32(2.0)


def twice_out(x: np.ndarray) -> np.ndarray:
    return np.multiply(x, 2.0, dtype=np.float32)


def twice_again(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    np.add(x, x, out=out)
    return out


def twice_loop(x: np.ndarray) -> np.ndarray:
    return (x + x).astype(x.dtype)


KERNELS = (twice, twice_out, twice_again, twice_loop)


def counting_op(name: str) -> tuple[Op, Counting]:
    reference = Counting()
    return make_op(name, reference), reference


def key_of(op: Op, x: np.ndarray) -> DispatchKey:
    region = op.region_of(x)
    return DispatchKey("cpu", op.name, region.bucket(), region.dtype)


def memo_calls(op: Op, reference: Counting, kernels: tuple[Callable[..., Any], ...],
               x: np.ndarray) -> int:
    """The reference's calls while a fresh memo gates ``kernels`` on ``x``, one key."""
    memo = GateMemo(GATE_SEED, None, lambda key: None)
    before = reference.calls
    for fn in kernels:
        assert memo.verdict(op, key_of(op, x), cand(fn, op.name), (x,)).kind == "pass"
    return reference.calls - before


def test_the_reference_runs_once_per_trial_for_all_the_candidates_of_a_key() -> None:
    op, reference = counting_op("shared_twice")
    x = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float32)
    alone = memo_calls(op, reference, KERNELS[:1], x)
    assert alone >= 5  # the dispatch's trial, the derived ones, their sensitivity probes
    assert memo_calls(op, reference, KERNELS, x) == alone  # was len(KERNELS) * alone


def test_a_tune_runs_the_reference_once_per_trial_for_all_its_candidates() -> None:
    op, reference = counting_op("shared_tune")
    x = np.random.default_rng(2).standard_normal((5, 33)).astype(np.float32)
    counts = []
    for kernels in (KERNELS[:1], KERNELS):
        before = reference.calls
        found = measured_arbitrate(op, (x,), [cand(fn, op.name) for fn in kernels],
                                   MeasureCache())
        assert found.candidate is not None
        counts.append(reference.calls - before)
    assert counts[1] == counts[0]


def test_inputs_changed_in_place_between_two_gates_make_new_trials() -> None:
    """Same key, same array object, new values: the trials are made again from them (a
    user op's trials are drawn from the inputs' values), never shared."""
    op, reference = counting_op("shared_changed")
    x = np.random.default_rng(3).standard_normal((6, 40)).astype(np.float32)
    memo = GateMemo(GATE_SEED, None, lambda key: None)
    key = key_of(op, x)
    assert memo.verdict(op, key, cand(twice, op.name), (x,)).kind == "pass"
    first = reference.calls
    x[2, 5] = np.float32(-0.0) if x[2, 5] == 0 else np.float32(0.0)  # one bit pattern
    assert memo.verdict(op, key, cand(twice_out, op.name), (x,)).kind == "pass"
    assert reference.calls == 2 * first


def wrong_twice(x: np.ndarray) -> np.ndarray:
    out = x * np.float32(2.0)
    out.reshape(-1)[-1] += np.float32(1.0)
    return out


def declines(x: np.ndarray) -> np.ndarray:
    raise ValueError("not this one")


@pytest.mark.parametrize("op_name,inputs,region", [
    ("softmax", None, SoftmaxRegion.of((6, 50), "float16")),
    ("softmax", (np.random.default_rng(4).standard_normal((7, 33)).astype(np.float32),), None),
    ("user", (np.random.default_rng(5).standard_normal((9, 17)).astype(np.float32),), None),
], ids=["softmax-region", "softmax-inputs", "user-op"])
def test_shared_trials_give_each_candidate_the_report_it_gets_alone(
        registry: CandidateRegistry, op_name: str, inputs: tuple[Any, ...] | None,
        region: SoftmaxRegion | None) -> None:
    from pytest_arbiter.core.trials import gate_trials

    if op_name == "user":
        op = make_op("shared_reports", lambda x: np.asarray(x, dtype=np.float64) * 2.0)
        kernels = [cand(fn, op.name) for fn in (wrong_twice, twice, declines, twice_out)]
    else:
        op = OPS.get("softmax")
        kernels = [registry.get("stable_softmax"), cand(lambda x: x * 0, "softmax", "zeros"),
                   registry.get("inplace_softmax"), cand(declines, "softmax")]
    shared = gate_trials(op, inputs=inputs, region=region, seed=GATE_SEED)
    for kernel in kernels:
        alone = f4_gate(kernel, op, inputs=inputs, region=region)
        together = f4_gate(kernel, op, inputs=inputs, region=region, trials=shared)
        assert together.to_dict() == alone.to_dict()


def test_an_output_with_bits_judged_before_on_a_trial_is_not_judged_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels returning the same bits get one judgement per trial (and the report each
    gets alone); an output one ulp off in one element is judged on its own, and fails."""
    from pytest_arbiter.core import gate as gate_module
    from pytest_arbiter.core.trials import gate_trials

    judged: list[int] = []
    real = gate_module._judge_values

    def counting(op: Op, index: int, prep: Any, out: np.ndarray) -> Any:
        judged.append(index)
        return real(op, index, prep, out)

    monkeypatch.setattr(gate_module, "_judge_values", counting)
    op = make_op("judged_once", lambda x: np.asarray(x, dtype=np.float64) * 2.0)
    x = np.random.default_rng(9).standard_normal((6, 40)).astype(np.float32)
    shared = gate_trials(op, inputs=(x,), region=None, seed=GATE_SEED)
    reports = [f4_gate(cand(fn, op.name), op, inputs=(x,), trials=shared) for fn in KERNELS]
    assert all(r.passed for r in reports)
    trials = len(reports[0].trials)
    assert sorted(judged) == list(range(trials))  # each trial once, for four kernels
    for fn, report in zip(KERNELS, reports, strict=True):
        assert report.to_dict() == f4_gate(cand(fn, op.name), op, inputs=(x,)).to_dict()
    judged.clear()
    wrong = f4_gate(cand(wrong_twice, op.name), op, inputs=(x,), trials=shared)
    assert wrong.rejected and judged[0] == 0


def test_a_kernel_writing_into_an_output_it_returned_before_is_judged_on_the_new_bits(
) -> None:
    """The verdicts kept per output hold copies: kernels that return one buffer, the
    second writing wrong values into it, are judged each on what it returned."""
    from pytest_arbiter.core.trials import gate_trials

    op = make_op("one_buffer", lambda x: np.asarray(x, dtype=np.float64) * 2.0)
    x = np.random.default_rng(10).standard_normal((5, 24)).astype(np.float32)
    buffers: dict[tuple[int, ...], np.ndarray] = {}

    def into_buffer(scale: float) -> Callable[[np.ndarray], np.ndarray]:
        def kernel(a: np.ndarray) -> np.ndarray:
            out = buffers.setdefault(a.shape, np.empty(a.shape, dtype=np.float32))
            np.multiply(a, np.float32(scale), out=out)
            return out
        return kernel

    shared = gate_trials(op, inputs=(x,), region=None, seed=GATE_SEED)
    right = f4_gate(cand(into_buffer(2.0), op.name, "right"), op, inputs=(x,), trials=shared)
    wrong = f4_gate(cand(into_buffer(2.5), op.name, "wrong"), op, inputs=(x,), trials=shared)
    assert right.passed and wrong.rejected


def counting_softmax() -> tuple[Op, list[int]]:
    """The built-in softmax as a new op object whose exact result counts its calls."""
    import dataclasses

    base = OPS.get("softmax")
    calls: list[int] = []

    def exact(x: np.ndarray) -> np.ndarray:
        calls.append(1)
        return base.exact(x)

    return dataclasses.replace(base, exact=exact), calls


def test_gates_on_one_region_make_its_trials_once_and_report_as_alone(
        registry: CandidateRegistry) -> None:
    """A built-in op's trials on a region alone are kept for the next gate on it: the
    reference runs once per trial for every candidate and every gate, and each report is
    the one a first gate gives."""
    from pytest_arbiter.core.trials import forget_region_trials

    op, calls = counting_softmax()
    region = SoftmaxRegion.of((5, 40), "bfloat16")
    kernels = [registry.get("stable_softmax"), cand(lambda x: x * 0, "softmax", "zeros"),
               registry.get("inplace_softmax")]
    first = [f4_gate(k, op, region=region).to_dict() for k in kernels]
    trials = len(calls)
    assert trials == len(first[0]["trials"])
    again = [f4_gate(k, op, region=region).to_dict() for k in reversed(kernels)]
    assert len(calls) == trials and again[::-1] == first
    forget_region_trials()
    assert [f4_gate(k, op, region=region).to_dict() for k in kernels] == first
    assert len(calls) == 2 * trials


def test_region_trials_are_kept_for_a_few_regions_of_one_op_object_and_seed(
        registry: CandidateRegistry) -> None:
    from pytest_arbiter.core.trials import REGION_TRIALS_KEPT, forget_region_trials

    forget_region_trials()
    op, calls = counting_softmax()
    other, other_calls = counting_softmax()
    kernel = registry.get("stable_softmax")
    regions = [SoftmaxRegion.of((3, 20 + i), "float32") for i in range(REGION_TRIALS_KEPT + 1)]
    f4_gate(kernel, op, region=regions[0])
    once = len(calls)
    f4_gate(kernel, other, region=regions[0])  # another op object: its own trials
    f4_gate(kernel, op, region=regions[0], seed=GATE_SEED + 1)  # another seed: too
    assert len(other_calls) == once and len(calls) == 2 * once
    for region in regions[1:]:
        f4_gate(kernel, op, region=region)
    made = len(calls)
    f4_gate(kernel, op, region=regions[0])  # pushed out by the later regions
    assert len(calls) == made + once


def test_region_trials_holding_more_than_the_bound_after_a_gate_are_not_kept(
        registry: CandidateRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a region's trials hold is measured after each gate: over the bound, the next
    gate on the region makes them again."""
    from pytest_arbiter.core import trials as trials_module

    op, calls = counting_softmax()
    region = SoftmaxRegion.of((5, 40), "float32")
    kernel = registry.get("stable_softmax")
    made = trials_module.gate_trials(op, inputs=None, region=region, seed=GATE_SEED)
    inputs = sum(x.nbytes for t in made.trials for x in t.trial.inputs)
    trials_module.forget_region_trials()
    monkeypatch.setattr(trials_module, "REGION_TRIALS_BYTES", 2 * inputs)
    first = f4_gate(kernel, op, region=region)
    once = len(calls)
    assert f4_gate(kernel, op, region=region) == first
    assert len(calls) == 2 * once  # made again: the first gate's trials held too much
    monkeypatch.setattr(trials_module, "REGION_TRIALS_BYTES", 1 << 30)
    f4_gate(kernel, op, region=region)
    f4_gate(kernel, op, region=region)
    assert len(calls) == 3 * once


def test_an_accepts_that_writes_leaves_a_regions_kept_trials_right(
        registry: CandidateRegistry) -> None:
    """An ``accepts()`` that writes to the arrays it is given does not leave
    the region's kept trials wrong for the candidates gated on it later."""
    from pytest_arbiter.core.trials import forget_region_trials

    forget_region_trials()
    op = OPS.get("softmax")
    region = SoftmaxRegion.of((4, 24), "float32")
    kernel = registry.get("stable_softmax")

    def nudges(x: np.ndarray) -> bool:
        x.reshape(-1)[0] += np.float32(1.0)
        return True

    nudging = FunctionCandidate(kernel.run, "nudging", "softmax", "cpu", 0, nudges, None)
    first = f4_gate(kernel, op, region=region)
    assert first.passed
    f4_gate(nudging, op, region=region)
    assert f4_gate(kernel, op, region=region) == first


@pytest.mark.parametrize("size", [8, 1 << 20], ids=["8-elements", "1M-elements"])
def test_an_accepts_that_writes_fails_its_own_candidate_and_no_later_one(size: int) -> None:
    """``accepts()`` sees copies of a key's shared trials, not the trials: one that
    writes to its inputs fails its own candidate, and a correct candidate gated after it
    on the same trials still passes."""
    from pytest_arbiter.core.trials import gate_trials

    x = np.random.default_rng(9).standard_normal(size).astype(np.float32)
    op = make_op(f"shared_accepts_{size}", lambda a: np.asarray(a, dtype=np.float64) * 2.0)
    shared = gate_trials(op, inputs=(x,), region=None, seed=GATE_SEED)

    def nudges(a: np.ndarray) -> bool:
        a.reshape(-1)[0] += np.float32(1.0)
        return True

    nudging = FunctionCandidate(twice, "nudging", op.name, "cpu", 0, nudges, None)
    bad = f4_gate(nudging, op, inputs=(x,), trials=shared)
    assert bad.rejected and "modified its inputs" in bad.reason
    assert shared.intact()
    good = f4_gate(cand(twice, op.name), op, inputs=(x,), trials=shared)
    assert good.passed, good.reason


def writes_one(index: int, value: float) -> Callable[[np.ndarray], np.ndarray]:
    def kernel(x: np.ndarray) -> np.ndarray:
        out = x * np.float32(2.0)
        x.reshape(-1)[index] = value
        return out
    return kernel


@pytest.mark.parametrize("size", [8, 1 << 20], ids=["8-elements", "1M-elements"])
@pytest.mark.parametrize("what", ["value", "negative-zero", "nan-payload"])
def test_a_kernel_writing_one_element_of_its_input_is_rejected(size: int, what: str) -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal(size).astype(np.float32)
    index = size - 3
    if what == "value":
        value = float(x[index]) + 1.0
    elif what == "negative-zero":
        x[index], value = 0.0, -0.0  # equal as values, not as bits
    else:
        x[index] = np.nan
        value = float(np.array([0x7FC00001], dtype=np.uint32).view(np.float32)[0])
    kept = x.copy()
    op = make_op(f"writes_{what}_{size}".replace("-", "_"),
                 lambda a: np.asarray(a, dtype=np.float64) * 2.0)
    report = f4_gate(cand(writes_one(index, value), op.name, "writes_one"), op, inputs=(x,))
    assert report.rejected and not report.passed
    assert report.reason == "the kernel modified its inputs"
    assert report.failing is not None and report.failing.index == 0
    assert np.array_equal(x.view(np.uint32), kept.view(np.uint32))  # the caller's: untouched


@pytest.mark.parametrize("size", [8, 1 << 20], ids=["8-elements", "1M-elements"])
def test_a_kernel_rewriting_the_same_bits_or_staging_another_dtype_passes(size: int) -> None:
    x = np.random.default_rng(7).standard_normal(size).astype(np.float32)
    op = make_op(f"rewrites_{size}", lambda a: np.asarray(a, dtype=np.float64) * 2.0)

    def same_bits(a: np.ndarray) -> np.ndarray:
        a[...] = a.copy()
        return a * np.float32(2.0)

    class Widened(Candidate):
        """Stages its input in float64 and back: the values stay, the dtype does not."""

        def prepare_inputs(self, *inputs: Any) -> tuple[Any, ...]:
            return tuple(np.asarray(a, dtype=np.float64) for a in inputs)

        def run(self, *inputs: Any) -> Any:
            return (inputs[0] * 2.0).astype(np.float32)

    for kernel in (cand(same_bits, op.name), Widened("widened", op.name, "cpu")):
        report = f4_gate(kernel, op, inputs=(x,))
        assert report.passed, report.summary()


def test_a_kernel_sleeping_past_the_call_timeout_fails_with_the_watchdogs_error(
        sigalrm_restored: None, monkeypatch: pytest.MonkeyPatch) -> None:
    handler = signal.getsignal(signal.SIGALRM)
    installs = []
    real_signal = signal.signal

    def counting(signum: int, action: Any) -> Any:
        if signum == signal.SIGALRM:
            installs.append(action)
        return real_signal(signum, action)

    monkeypatch.setattr(signal, "signal", counting)
    op = make_op("sleepy_twice", lambda a: np.asarray(a, dtype=np.float64) * 2.0)
    x = np.random.default_rng(8).standard_normal((4, 40)).astype(np.float32)

    def sleepy(a: np.ndarray) -> np.ndarray:
        time.sleep(10)
        return a * np.float32(2.0)

    memo = GateMemo(GATE_SEED, 0.1, lambda key: None)
    start = time.perf_counter()
    found = memo.verdict(op, key_of(op, x), cand(sleepy, op.name), (x,))
    assert time.perf_counter() - start < 8.0
    assert found.kind == "error"
    assert found.reason.startswith("in the F4 gate, on input #0 (")
    assert "raised CallTimeout: no result after 0.1 s" in found.reason
    report = f4_gate(cand(sleepy, op.name), op, inputs=(x,), call_timeout_s=0.1)
    assert len(report.trials) >= 3 and all(t.status == "error" for t in report.trials)
    assert len(installs) == 4  # installed and restored once per gate, not per trial
    assert signal.getsignal(signal.SIGALRM) is handler


@pytest.mark.parametrize("size", [8, 1 << 20], ids=["8-elements", "1M-elements"])
def test_a_writing_kernel_gated_after_a_correct_one_on_shared_trials_is_rejected(
        size: int) -> None:
    """The copies' bytes (or checksums) kept from the first candidate's checks still find
    the second one's write, and the trials stay as they were made."""
    from pytest_arbiter.core.trials import gate_trials, held_bytes

    x = np.random.default_rng(8).standard_normal(size).astype(np.float32)
    op = make_op(f"shared_writes_{size}", lambda a: np.asarray(a, dtype=np.float64) * 2.0)
    shared = gate_trials(op, inputs=(x,), region=None, seed=GATE_SEED)
    good = f4_gate(cand(lambda a: a * np.float32(2.0), op.name, "twice"), op, inputs=(x,),
                   trials=shared)
    assert good.passed
    held = held_bytes(shared)
    bad = f4_gate(cand(writes_one(size - 3, 7.0), op.name, "writes_one"), op, inputs=(x,),
                  trials=shared)
    assert bad.rejected and bad.reason == "the kernel modified its inputs"
    assert shared.intact() and held_bytes(shared) >= held
    if size == 8:
        assert shared.trials[0].raw  # the small input compared by its kept bytes
