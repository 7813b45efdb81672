"""Issue 30, point 4: timing that times the kernel, per device.

Against a fake CuPy with two GPUs: one untimed call before the first timed one; events
and the L2 flush buffer of the device current at each sample; probe results per device;
measurement locks per device UUID, so two GPUs with one tag time in parallel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pytest_arbiter.extend import device as core_device
from pytest_arbiter.runtime.cuda.timer import CudaEventTimer
from pytest_arbiter.timing.device_lock import lock_path, measurement_lock
from tests.runtime.cuda_fakes import H100, RTX5090, FakeGpu


@pytest.fixture
def two_gpus(cupy_as: Callable[[Any], None], monkeypatch: pytest.MonkeyPatch,
             tmp_path: Any) -> Iterator[FakeGpu]:
    monkeypatch.setenv("PYTEST_ARBITER_LOCK_DIR", str(tmp_path))
    gpu = FakeGpu(H100, H100)
    cupy_as(gpu.cp)
    yield gpu


def test_the_first_sample_of_a_function_follows_one_untimed_call(two_gpus: FakeGpu) -> None:
    calls: list[str] = []

    def kernel() -> None:
        calls.append("timed" if two_gpus.log[-1:] == ["record timing event 0 on device 0"]
                     else "untimed")

    timer = CudaEventTimer(flush_l2=False)
    timer.sample(kernel)
    timer.sample(kernel)
    assert calls == ["untimed", "timed", "timed"]
    other = CudaEventTimer(flush_l2=False)
    other.sample(lambda: calls.append("another timer's first call"))
    assert calls[-2:] == ["another timer's first call"] * 2


def test_events_and_the_flush_buffer_belong_to_the_current_device(two_gpus: FakeGpu) -> None:
    timer = CudaEventTimer(flush_l2=True)
    timer.sample(lambda: None)
    two_gpus.current = 1
    timer.sample(lambda: None)  # a fake event of device 0 refuses to record on device 1
    allocs = [line for line in two_gpus.log if line.startswith("alloc")]
    assert allocs == [f"alloc {100 << 20} on device 0", f"alloc {100 << 20} on device 1"]
    assert "record timing event 3 on device 1" in two_gpus.log


def test_probe_results_are_per_device(cupy_as: Callable[[Any], None]) -> None:
    gpu = FakeGpu(H100, RTX5090)
    cupy_as(gpu.cp)
    assert core_device.device_tag("nvidia") == "sm_90"
    gpu.current = 1
    assert core_device.device_tag("nvidia") == "sm_120"
    gpu.current = 0
    found = core_device.probe_device("nvidia")
    assert isinstance(found, core_device.DeviceInfo) and found.uuid == "01" * 16


def test_two_gpus_with_one_tag_have_their_own_measurement_lock(two_gpus: FakeGpu) -> None:
    assert core_device.device_tag("nvidia") == "sm_90"
    first = lock_path(core_device.lock_identity("sm_90"))
    two_gpus.current = 1
    assert core_device.device_tag("nvidia") == "sm_90"
    assert lock_path(core_device.lock_identity("sm_90")) != first
    two_gpus.current = 0
    held: list[bool] = []
    with measurement_lock(core_device.lock_identity("sm_90")) as mine:
        two_gpus.current = 1  # another worker, on the other H100

        def other_worker() -> None:
            with measurement_lock(core_device.lock_identity("sm_90"), timeout_s=0.5) as theirs:
                held.append(theirs)

        worker = threading.Thread(target=other_worker)
        worker.start()
        worker.join()
    assert mine and held == [True]
