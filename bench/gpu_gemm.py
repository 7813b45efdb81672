"""Emitted vs library GEMM on an NVIDIA GPU: TFLOP/s per dtype and size, CUDA-event timed.

Run: python bench/gpu_gemm.py [--sizes 1024,2048,4096] [--dtypes float16,bfloat16,float32]
                              [--repeat 20] [--require-device]
Prints one compact table, a row as soon as it is measured (a step cut short by its
timeout keeps the rows so far): library (cuBLAS through cupy.matmul) against the bundled
kernel of the emitted lane, the ratio, the largest difference between the two results
and the lane measured arbitration picks for that bucket. Each candidate is F4-gated
once per dtype at a small region (GATE_SIZE cubed, with its ragged neighbours), not at
the timed size: the gate's float64 host reference at 4096^3 alone takes minutes of CPU.
Without a GPU it says why and exits 0 (2 with --require-device).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pytest_arbiter import ComparePolicy, MeasureCache, measured_arbitrate
from pytest_arbiter.core.candidates import Candidate
from pytest_arbiter.core.ops import OPS
from pytest_arbiter.core.regions import MatmulRegion
from pytest_arbiter.decision.gating import Verdict, f4_gate, verdict_of
from pytest_arbiter.extend.backends import DeviceInfo
from pytest_arbiter.extend.device import probe_device
from pytest_arbiter.runtime import cuda
from pytest_arbiter.runtime.cuda.lane import GpuCandidate, bfloat16_problem
from pytest_arbiter.timing.measure import measure_latency

LIBRARY = "cublas_matmul"
EMITTED = {"float32": "tiled_sgemm", "float16": "mma_matmul", "bfloat16": "mma_matmul"}
POLICY = ComparePolicy(min_rounds=5, max_rounds=30, budget_s=0.2)
GATE_SIZE = 256
_VERDICTS: dict[tuple[str, str], Verdict] = {}


def small_gate(cand: Candidate, dtype: str) -> Verdict:
    """``cand``'s F4 verdict at GATE_SIZE cubed in ``dtype``, worked out once."""
    key = (cand.name, dtype)
    if key not in _VERDICTS:
        region = MatmulRegion.of(GATE_SIZE, GATE_SIZE, GATE_SIZE, dtype)
        _VERDICTS[key] = verdict_of(f4_gate(cand, OPS.get("matmul"), region=region))
    return _VERDICTS[key]


@dataclass(frozen=True)
class Row:
    dtype: str
    size: int
    library_tflops: float
    emitted_tflops: float | None
    max_rel_diff: float | None
    pick: str
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.emitted_tflops is None or self.library_tflops <= 0:
            return None
        return self.emitted_tflops / self.library_tflops


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(device: DeviceInfo, rows: Sequence[Row]) -> str:
    """A markdown table of the rows, headed by the device they were measured on."""
    lines = [f"device: {device.tag} ({device.name})",
             "| dtype | M=N=K | library TFLOP/s | emitted TFLOP/s | emitted/library "
             "| max rel diff | arbiter pick |",
             "|---|---|---|---|---|---|---|"]
    lines.extend(table_row(r) for r in rows)
    return "\n".join(lines)


def table_row(r: Row) -> str:
    """One measured row of :func:`table`."""
    return (f"| {r.dtype} | {r.size} | {r.library_tflops:.1f} | "
            f"{_fmt(r.emitted_tflops, '.1f')} | {_fmt(r.ratio, '.0%')} | "
            f"{_fmt(r.max_rel_diff, '.1e')} | {r.pick}{r.note} |")


def _tflops(size: int, median_ns: float) -> float:
    return 2.0 * size**3 / median_ns / 1e3


def measure(size: int, dtype: str, repeat: int) -> Row:
    """Time both lanes on one square GEMM and let measured arbitration pick."""
    from pytest_arbiter.runtime.cuda.device import load_cupy
    from pytest_arbiter.runtime.cuda.timer import CudaEventTimer

    cp = load_cupy()
    found = {c.name: c for c in cuda.candidates() if isinstance(c, GpuCandidate)}
    library, emitted = found[LIBRARY], found[EMITTED[dtype]]
    rng = np.random.default_rng(size)
    a = cp.asarray(rng.standard_normal((size, size)).astype(dtype))
    b = cp.asarray(rng.standard_normal((size, size)).astype(dtype))
    timer = CudaEventTimer(flush_l2=True)
    lib = measure_latency(library.run, a, b, warmup=3, repeat=repeat, timer=timer)
    emitted_tflops = diff = None
    if emitted.accepts(a, b):
        em = measure_latency(emitted.run, a, b, warmup=3, repeat=repeat, timer=timer)
        emitted_tflops = _tflops(size, em.median_ns)
        want = library.run(a, b).astype(cp.float32)
        got = emitted.run(a, b).astype(cp.float32)
        diff = float(cp.abs(got - want).max() / cp.maximum(cp.abs(want).max(), 1e-30))
    sel = measured_arbitrate("matmul", (a, b), [library, emitted], MeasureCache(),
                             target="nvidia", policy=POLICY,
                             verdict=lambda cand: small_gate(cand, dtype))
    pick = sel.candidate.name if sel.candidate is not None else "none"
    note = " (tie)" if sel.comparison is not None and sel.comparison.tie else ""
    return Row(dtype, size, _tflops(size, lib.median_ns), emitted_tflops, diff, pick, note)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1024,2048,4096")
    parser.add_argument("--dtypes", default="float16,bfloat16,float32")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--require-device", action="store_true",
                        help="exit 2 instead of 0 when there is no NVIDIA GPU")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = sorted(set(dtypes) - set(EMITTED))
    if unknown:
        parser.error(f"unknown dtype(s) {', '.join(unknown)}; choose from {', '.join(EMITTED)}")
    found = probe_device("nvidia")
    if not isinstance(found, DeviceInfo):
        print(f"gpu_gemm: no NVIDIA GPU here, nothing measured: {found}")
        return 2 if args.require_device else 0
    print(table(found, []), flush=True)
    for dtype in dtypes:
        if dtype == "bfloat16" and bfloat16_problem() is not None:
            print(f"gpu_gemm: bfloat16 skipped: {bfloat16_problem()}", flush=True)
            continue
        for size in sizes:
            print(table_row(measure(size, dtype, args.repeat)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
