"""pytest-arbiter: gate, measure and arbitrate competing compute kernels.

The public names here are the contract users write against (SPEC.md). They are
imported on first use (PEP 562), so that pytest loading the plugin into a run that
never dispatches imports neither NumPy nor the kernels; the bundled runtime registers
its candidates the first time the registry is read. Importing the package never
imports pytest or CuPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_HOME = {
    "Arbiter": "arbiter", "CacheMiss": "arbiter", "Selection": "arbiter",
    "arbitrate": "arbiter", "default_arbiter": "arbiter", "dispatch_histogram": "arbiter",
    "measured_arbitrate": "arbiter", "register_timer": "arbiter",
    "run_arbitrated": "arbiter", "run_measured_arbitrated": "arbiter",
    "CacheEntry": "cache", "MeasureCache": "cache",
    "REGISTRY": "candidates", "Candidate": "candidates", "CandidateRegistry": "candidates",
    "Decline": "candidates", "candidate": "candidates",
    "DeviceInfo": "device", "cpu_device": "device", "device_tag": "device",
    "register_device_probe": "device",
    "GateCase": "fixture", "gate_matrix": "fixture",
    "GateReport": "gate", "f4_gate": "gate",
    "OUTCOMES": "histogram", "DispatchHistogram": "histogram",
    "ComparePolicy": "measure", "CpuTimer": "measure", "LatencyStats": "measure",
    "Timer": "measure", "measure_latency": "measure",
    "OPS": "ops", "Op": "ops", "op": "ops",
    "MatmulRegion": "regions", "Region": "regions", "SoftmaxRegion": "regions",
}

__all__ = [
    "OPS",
    "OUTCOMES",
    "REGISTRY",
    "Arbiter",
    "CacheEntry",
    "CacheMiss",
    "Candidate",
    "CandidateRegistry",
    "ComparePolicy",
    "CpuTimer",
    "Decline",
    "DeviceInfo",
    "DispatchHistogram",
    "GateCase",
    "GateReport",
    "LatencyStats",
    "MatmulRegion",
    "MeasureCache",
    "Op",
    "Region",
    "Selection",
    "SoftmaxRegion",
    "Timer",
    "__version__",
    "arbitrate",
    "candidate",
    "cpu_device",
    "default_arbiter",
    "device_tag",
    "dispatch_histogram",
    "f4_gate",
    "gate_matrix",
    "measure_latency",
    "measured_arbitrate",
    "op",
    "register_device_probe",
    "register_timer",
    "run_arbitrated",
    "run_measured_arbitrated",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'pytest_arbiter' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"pytest_arbiter.{home}"), name)
    globals()[name] = value  # the next lookup is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOME])


if TYPE_CHECKING:
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
    from pytest_arbiter.candidates import (
        REGISTRY,
        Candidate,
        CandidateRegistry,
        Decline,
        candidate,
    )
    from pytest_arbiter.device import DeviceInfo, cpu_device, device_tag, register_device_probe
    from pytest_arbiter.fixture import GateCase, gate_matrix
    from pytest_arbiter.gate import GateReport, f4_gate
    from pytest_arbiter.histogram import OUTCOMES, DispatchHistogram
    from pytest_arbiter.measure import (
        ComparePolicy,
        CpuTimer,
        LatencyStats,
        Timer,
        measure_latency,
    )
    from pytest_arbiter.ops import OPS, Op, op
    from pytest_arbiter.regions import MatmulRegion, Region, SoftmaxRegion
