"""pytest-arbiter: gate, measure and arbitrate competing compute kernels.

The public names here are the contract users write against (SPEC.md); importing the
package registers the bundled CPU runtime and never imports pytest or CuPy.
"""

from __future__ import annotations

__version__ = "0.1.0"

from pytest_arbiter import runtime as _runtime  # noqa: F401  registers the bundled kernels
from pytest_arbiter.arbiter import (
    Arbiter,
    CacheMiss,
    Selection,
    arbitrate,
    default_arbiter,
    dispatch_histogram,
    measured_arbitrate,
    register_timer,
    run_arbitrated,
    run_measured_arbitrated,
)
from pytest_arbiter.cache import CacheEntry, MeasureCache
from pytest_arbiter.candidates import REGISTRY, Candidate, CandidateRegistry, Decline, candidate
from pytest_arbiter.device import DeviceInfo, cpu_device, device_tag, register_device_probe
from pytest_arbiter.fixture import GateCase, gate_matrix
from pytest_arbiter.gate import GateReport, f4_gate
from pytest_arbiter.histogram import OUTCOMES, DispatchHistogram
from pytest_arbiter.measure import ComparePolicy, CpuTimer, LatencyStats, Timer, measure_latency
from pytest_arbiter.ops import OPS, Op, op
from pytest_arbiter.regions import MatmulRegion, Region, SoftmaxRegion

__all__ = [
    "OPS", "OUTCOMES", "REGISTRY", "Arbiter", "CacheEntry", "CacheMiss", "Candidate",
    "CandidateRegistry", "ComparePolicy", "CpuTimer", "Decline", "DeviceInfo",
    "DispatchHistogram", "GateCase", "GateReport", "LatencyStats", "MatmulRegion",
    "MeasureCache", "Op", "Region", "Selection", "SoftmaxRegion", "Timer", "__version__",
    "arbitrate", "candidate", "cpu_device", "default_arbiter", "device_tag",
    "dispatch_histogram", "f4_gate", "gate_matrix", "measure_latency", "measured_arbitrate",
    "op", "register_device_probe", "register_timer", "run_arbitrated",
    "run_measured_arbitrated",
]
