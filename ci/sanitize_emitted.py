"""Run the F4 gate of every emitted kernel on small shapes, for compute-sanitizer to watch.

    compute-sanitizer --tool memcheck --error-exitcode 3 python ci/sanitize_emitted.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python ci/sanitize_emitted.py

The shapes have partial tiles along every edge, so the kernels' predicated loads and
stores run. Exit status: 0 when every gate passed, 1 when one failed, 2 when there is no
NVIDIA device the emitted lane can use (the reason is printed).
"""

from __future__ import annotations

import sys

from pytest_arbiter.core.ops import OPS
from pytest_arbiter.core.regions import MatmulRegion, Region, SoftmaxRegion
from pytest_arbiter.decision.gating import f4_gate
from pytest_arbiter.runtime.cuda import emitted
from pytest_arbiter.runtime.cuda.device import load_cupy
from pytest_arbiter.runtime.cuda.lane import bfloat16_problem

CASES: list[tuple[str, Region]] = [
    ("tiled_sgemm", MatmulRegion.of(131, 129, 17, "float32")),
    ("mma_matmul", MatmulRegion.of(272, 136, 96, "float16")),
    ("mma_matmul", MatmulRegion.of(144, 264, 64, "bfloat16")),
    ("fused_softmax", SoftmaxRegion.of((3, 2500), "float32")),
    ("fused_softmax", SoftmaxRegion.of((3, 2500), "float16")),
    ("fused_softmax", SoftmaxRegion.of((3, 2500), "bfloat16")),
]


def main() -> int:
    candidates = {c.name: c for c in emitted.candidates()}
    reason = candidates["mma_matmul"].unavailable_reason()
    if reason is not None:
        print(f"sanitize_emitted: the emitted lane cannot run here: {reason}")
        return 2
    # Without CuPy's memory pool each array is its own allocation, so memcheck sees an
    # overrun into the next array instead of into pooled slack.
    load_cupy().cuda.set_allocator(None)
    failed = 0
    for name, region in CASES:
        if region.dtype == "bfloat16" and bfloat16_problem() is not None:
            print(f"sanitize_emitted: {name} bfloat16 skipped: {bfloat16_problem()}")
            continue
        cand = candidates[name]
        report = f4_gate(cand, OPS.get(cand.op), region=region)
        print(f"{name} {region.describe()}: {'passed' if report.passed else 'FAILED'}, "
              f"{len(report.trials)} inputs")
        if not report.passed:
            print(report.summary())
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
