"""Which bundled CPU candidate wins where: measured arbitration over a shape sweep.

Run: python bench/cpu_runtime.py   (prints a markdown table; figures go to docs/runtime.md)
"""

from __future__ import annotations

import numpy as np

from pytest_arbiter import ComparePolicy, MeasureCache, measured_arbitrate
from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.extend.device import cpu_device
from pytest_arbiter.runtime import register_bundled

MATMUL = [(16, 16, 16), (64, 64, 64), (256, 256, 256), (1024, 1024, 1024),
          (1, 4096, 4096), (4096, 1, 4096), (2048, 64, 2048), (24, 16, 32)]
SOFTMAX = [(8, 64), (64, 1024), (1024, 4096)]
POLICY = ComparePolicy(min_rounds=9, max_rounds=60, budget_s=0.5)


def main() -> None:
    reg = CandidateRegistry()
    register_bundled(reg)
    rng = np.random.default_rng(0)
    print(f"device: {cpu_device().tag}")
    print("| op | shape | dtype | winner | runner-up / winner | others |")
    print("|---|---|---|---|---|---|")
    for dtype in ("float32", "float16", "bfloat16"):
        cases: list[tuple[str, tuple[int, ...], tuple[np.ndarray, ...]]] = []
        for m, n, k in MATMUL:
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            cases.append(("matmul", (m, n, k), (a, b)))
        for shape in SOFTMAX:
            cases.append(("softmax", shape, (rng.standard_normal(shape).astype(dtype),)))
        for op, shape, inputs in cases:
            sel = measured_arbitrate(op, inputs, reg.for_op(op), MeasureCache(), policy=POLICY)
            comp = sel.comparison
            assert comp is not None and sel.candidate is not None
            ratios = sorted((r, n) for n, r in comp.ratios.items() if n != comp.ranking[0])
            first = f"{ratios[0][0]:.2f} ({ratios[0][1]})" if ratios else "-"
            rest = ", ".join(f"{n} {r:.2f}" for r, n in ratios[1:]) or "-"
            print(f"| {op} | {'x'.join(map(str, shape))} | {dtype} | {sel.candidate.name} | "
                  f"{first} | {rest} |")


if __name__ == "__main__":
    main()
