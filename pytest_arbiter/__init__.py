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
    "StaleEntry": "arbiter", "Considered": "cache",
    "current_environment": "fingerprint", "fingerprint_of": "fingerprint",
    "allow_tf32": "ops", "RecheckPolicy": "recheck", "RecheckResult": "recheck",
    "arbitrate": "arbiter", "measured_arbitrate": "arbiter", "register_timer": "arbiter",
    "ConfigurationError": "process", "configure": "process", "default_arbiter": "process",
    "dispatch": "process", "dispatch_histogram": "process", "run_arbitrated": "process",
    "run_measured_arbitrated": "process",
    "Backend": "backends", "hookimpl": "hookspecs",
    "CacheEntry": "cache", "MeasureCache": "cache",
    "REGISTRY": "candidates", "Candidate": "candidates", "CandidateRegistry": "candidates",
    "Decline": "candidates", "FunctionCandidate": "candidates", "candidate": "candidates",
    "register_target": "candidates",
    "DeviceInfo": "device", "cpu_device": "device", "device_tag": "device",
    "register_device_probe": "device",
    "ArbiterFixture": "fixture", "GateCase": "fixture", "gate_matrix": "fixture",
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
    "ArbiterFixture",
    "Backend",
    "CacheEntry",
    "CacheMiss",
    "Candidate",
    "CandidateRegistry",
    "ComparePolicy",
    "ConfigurationError",
    "Considered",
    "CpuTimer",
    "Decline",
    "DeviceInfo",
    "DispatchHistogram",
    "FunctionCandidate",
    "GateCase",
    "GateReport",
    "LatencyStats",
    "MatmulRegion",
    "MeasureCache",
    "Op",
    "RecheckPolicy",
    "RecheckResult",
    "Region",
    "Selection",
    "SoftmaxRegion",
    "StaleEntry",
    "Timer",
    "__version__",
    "allow_tf32",
    "arbitrate",
    "candidate",
    "configure",
    "cpu_device",
    "current_environment",
    "default_arbiter",
    "device_tag",
    "dispatch",
    "dispatch_histogram",
    "f4_gate",
    "fingerprint_of",
    "gate_matrix",
    "hookimpl",
    "measure_latency",
    "measured_arbitrate",
    "op",
    "register_device_probe",
    "register_target",
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
        StaleEntry,
        arbitrate,
        measured_arbitrate,
        register_timer,
    )
    from pytest_arbiter.backends import Backend
    from pytest_arbiter.cache import CacheEntry, Considered, MeasureCache
    from pytest_arbiter.candidates import (
        REGISTRY,
        Candidate,
        CandidateRegistry,
        Decline,
        FunctionCandidate,
        candidate,
        register_target,
    )
    from pytest_arbiter.device import DeviceInfo, cpu_device, device_tag, register_device_probe
    from pytest_arbiter.fingerprint import current_environment, fingerprint_of
    from pytest_arbiter.fixture import ArbiterFixture, GateCase, gate_matrix
    from pytest_arbiter.gate import GateReport, f4_gate
    from pytest_arbiter.histogram import OUTCOMES, DispatchHistogram
    from pytest_arbiter.hookspecs import hookimpl
    from pytest_arbiter.measure import (
        ComparePolicy,
        CpuTimer,
        LatencyStats,
        Timer,
        measure_latency,
    )
    from pytest_arbiter.ops import OPS, Op, allow_tf32, op
    from pytest_arbiter.process import (
        ConfigurationError,
        configure,
        default_arbiter,
        dispatch,
        dispatch_histogram,
        run_arbitrated,
        run_measured_arbitrated,
    )
    from pytest_arbiter.recheck import RecheckPolicy, RecheckResult
    from pytest_arbiter.regions import MatmulRegion, Region, SoftmaxRegion
