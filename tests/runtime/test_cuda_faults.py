"""Issue 30, point 2: a device fault stays with the candidate that caused it.

A fake CuPy whose launches return at once and whose faults are sticky, as on a device:
the fault must surface inside the faulting candidate's guarded call, mark the lane
unusable (later dispatches: ``no_candidate`` with the reason), and a hang must end at
the watchdog instead of blocking in a copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from pytest_arbiter import Arbiter
from pytest_arbiter.core.candidates import Candidate, CandidateRegistry
from pytest_arbiter.core.ops import OPS
from pytest_arbiter.decision.gating import f4_gate
from pytest_arbiter.errors import CallTimeout, GpuLaneLost
from pytest_arbiter.extend import device as core_device
from pytest_arbiter.gating.histogram import NO_CANDIDATE
from pytest_arbiter.runtime.cuda.shipped import LibraryMatmul
from pytest_arbiter.timing.watchdog import watchdog
from tests.runtime.cuda_fakes import FakeArray, FakeGpu


class FaultingMatmul(LibraryMatmul):
    """Launches a GEMM that faults on the device: the launch itself returns fine."""

    def launch(self, cp: Any, *inputs: Any) -> Any:
        out = FakeArray(GPU[0], inputs[0]._data @ inputs[1]._data)
        GPU[0].fault()
        return out


class HangingMatmul(LibraryMatmul):
    def launch(self, cp: Any, *inputs: Any) -> Any:
        GPU[0].hung = True
        return FakeArray(GPU[0], inputs[0]._data @ inputs[1]._data)


GPU: list[FakeGpu] = []


@pytest.fixture
def gpu(cupy_as: Callable[[Any], None]) -> Iterator[FakeGpu]:
    found = FakeGpu()
    GPU[:] = [found]
    cupy_as(found.cp)
    yield found
    GPU.clear()


def mats(m: int = 16, n: int = 8, k: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(m * n * k)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def test_a_fault_is_the_faulting_candidates_error_inside_the_gate(gpu: FakeGpu) -> None:
    cand = FaultingMatmul("faulting_matmul", "matmul", "nvidia", 3, ("float32",))
    report = f4_gate(cand, OPS.get("matmul"), inputs=mats())
    assert not report.passed and not report.rejected
    assert "sticky CUDA error" in report.error and "cudaErrorIllegalAddress" in report.error
    assert "unusable for the rest of this process" in str(core_device.probe_device("nvidia"))


def test_a_device_output_is_copied_back_inside_the_guard(gpu: FakeGpu) -> None:
    """Any candidate (not only the bundled lane's): a fault at the copy back is its error."""

    class Lazy(Candidate):
        def run(self, *inputs: Any) -> Any:
            out = FakeArray(gpu, inputs[0] @ inputs[1])
            gpu.fault()  # what a launch that faults later looks like from the host
            return out

    report = f4_gate(Lazy("lazy", "matmul", "nvidia"), OPS.get("matmul"), inputs=mats())
    assert report.trials[0].status == "error" and "IllegalAddress" in report.error


def test_after_a_sticky_fault_later_dispatches_are_no_candidate(gpu: FakeGpu) -> None:
    reg = CandidateRegistry()
    reg.add(FaultingMatmul("faulting_matmul", "matmul", "nvidia", 3, ("float32",)))
    arb = Arbiter(registry=reg, mode="static")
    a, b = mats()
    np.testing.assert_allclose(arb.dispatch("matmul", a, b, target="nvidia"), a @ b,
                               rtol=1e-4, atol=1e-4)
    assert arb.histogram.counts() == {("nvidia", "matmul", "faulting_matmul", "error"): 1}
    assert "sticky CUDA error" in arb.errors[("nvidia", "matmul", "faulting_matmul")]
    c, d = mats(64, 64, 64)  # another key: planned after the fault
    np.testing.assert_allclose(arb.dispatch("matmul", c, d, target="nvidia"), c @ d,
                               rtol=1e-4, atol=1e-4)
    delta = arb.histogram.counts()
    assert delta[("nvidia", "matmul", NO_CANDIDATE, "no_candidate")] == 1
    assert sum(1 for key in delta if key[3] == "error") == 1  # loud once, never rejected
    assert not any(key[3] == "rejected" for key in delta)
    event = arb.events[next(k for k in arb.events if k[2].startswith("64x64x64"))]
    assert all("unusable for the rest of this process" in why
               for why in event.passed_over.values())


def test_a_hang_ends_at_the_watchdog_and_ends_the_lane(gpu: FakeGpu) -> None:
    cand = HangingMatmul("hanging_matmul", "matmul", "nvidia", 3, ("float32",))
    a, b = cand.prepare_inputs(*mats())
    started = time.perf_counter()
    with pytest.raises(CallTimeout), watchdog(0.3):
        cand.run(a, b)
    assert time.perf_counter() - started < 5.0
    reason = core_device.probe_device("nvidia")
    assert isinstance(reason, str) and "still running when the watchdog stopped it" in reason

    with pytest.raises(GpuLaneLost):  # nothing more is queued behind the hang
        cand.run(a, b)


def test_a_gate_with_a_call_timeout_reports_the_hang_as_an_error(gpu: FakeGpu) -> None:
    cand = HangingMatmul("hanging_matmul", "matmul", "nvidia", 3, ("float32",))
    report = f4_gate(cand, OPS.get("matmul"), inputs=mats(), call_timeout_s=0.3)
    assert report.trials[0].status == "error" and "CallTimeout" in report.trials[0].reason


def test_only_sticky_statuses_end_the_lane(gpu: FakeGpu) -> None:
    from pytest_arbiter.runtime.cuda import faults
    from tests.runtime.cuda_fakes import CUDARuntimeError

    with pytest.raises(CUDARuntimeError), faults.device_work("nvidia", "x"):
        raise CUDARuntimeError(2, "cudaErrorMemoryAllocation: out of memory")
    assert faults.lost_reason("nvidia") is None
    assert faults.sticky_status(CUDARuntimeError(719, "launch failure")) == 719
    assert faults.sticky_status(RuntimeError("719")) is None
