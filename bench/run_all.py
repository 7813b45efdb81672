"""Every performance figure of docs/performance.md, measured side by side in one run.

Run: python bench/run_all.py [--quick]
Prints a compact table: each figure beside its target. Timing lives here, never in the
default test run, because the machines this runs on are shared and noisy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pytest_arbiter import Arbiter, ComparePolicy, MeasureCache, measured_arbitrate
from pytest_arbiter.candidates import CandidateRegistry
from pytest_arbiter.histogram import DispatchHistogram
from pytest_arbiter.measure import compare_latencies
from pytest_arbiter.runtime import register_bundled

Row = tuple[str, str, str, bool]


def _interleaved_medians(fns: list[Callable[[], object]], rounds: int, inner: int) -> list[float]:
    samples: list[list[float]] = [[] for _ in fns]
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            start = clock()
            for _ in range(inner):
                fn()
            samples[i].append((clock() - start) / inner)
    return [statistics.median(s) for s in samples]


def hot_path() -> list[Row]:
    """A cache-hit dispatch of a 16x16 float32 matmul against a direct call of the winner."""
    arb = Arbiter(mode="tune")
    a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    arb.dispatch("matmul", a, b)
    winner = arb.registry.get(arb.cache.entries()[0].winner)
    direct, dispatched = _interleaved_medians(
        [lambda: winner.run(a, b), lambda: arb.dispatch("matmul", a, b)], rounds=41, inner=2000)
    extra = dispatched - direct
    return [("hot path: dispatch - direct (16x16 f32 matmul)", f"{extra:.0f} ns "
             f"(direct {direct:.0f} ns, ratio {dispatched / direct:.2f})", "<= 1500 ns",
             extra <= 1500)]


def _sum_kernel(n: int) -> Callable[[np.ndarray], float]:
    def kernel(x: np.ndarray) -> float:
        return float(x[:n].sum())

    return kernel


def tuner(trials: int) -> list[Row]:
    """Two correct reductions 5% apart in work: how often is the faster one picked?"""
    x = np.random.default_rng(0).standard_normal(400_000)
    n_fast = 200_000
    n_slow = int(n_fast * 1.05)
    fast, slow = _sum_kernel(n_fast), _sum_kernel(n_slow)
    right = 0
    timed: list[float] = []
    for trial in range(trials):
        fns = {"fast": lambda: fast(x), "slow": lambda: slow(x)}
        comparison = compare_latencies(fns, tiers={"fast": 0, "slow": 1},
                                       policy=ComparePolicy(seed=trial))
        right += comparison.ranking[0] == "fast"
        timed.append(comparison.timed_ns / 1e6)
    share = right / trials
    one = statistics.median(
        _interleaved_medians([lambda: fast(x)], rounds=21, inner=5)) / 1e3
    return [
        ("tuner: picks the 5%-faster of two", f"{share:.1%} of {trials} "
         f"(kernel ~{one:.0f} us)", ">= 99%", share >= 0.99),
        ("tuner: timing spent per pair", f"median {statistics.median(timed):.1f} ms, "
         f"max {max(timed):.1f} ms", "<= 10 ms", max(timed) <= 10.5),
    ]


def idle_plugin(tests: int) -> list[Row]:
    """A suite of trivial tests with the plugin loaded against ``-p no:arbiter``."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "test_trivial.py").write_text(
            "import pytest\n\n"
            f"@pytest.mark.parametrize('i', range({tests}))\n"
            "def test_trivial(i):\n    assert i >= 0\n")
        Path(tmp, "pytest.ini").write_text("[pytest]\n")
        env = {**os.environ, "PYTEST_ADDOPTS": ""}

        def run(*extra: str) -> float:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            *extra], cwd=tmp, env=env, check=True, capture_output=True)
            return time.perf_counter() - start

        with_plugin: list[float] = []
        without: list[float] = []
        for _ in range(5):
            with_plugin.append(run())
            without.append(run("-p", "no:arbiter"))
    ratio = statistics.median(with_plugin) / statistics.median(without)
    return [(f"idle plugin: {tests} trivial tests", f"{ratio:.3f}x "
             f"({statistics.median(with_plugin):.2f} s vs {statistics.median(without):.2f} s)",
             "<= 1.05x", ratio <= 1.05)]


def histogram_memory(dispatches: int) -> list[Row]:
    hist = DispatchHistogram()
    count = hist.counter(("cpu", "matmul", "k", "won"))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(dispatches):
        count()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    ok = hist.counts()[("cpu", "matmul", "k", "won")] == dispatches
    return [(f"histogram: memory after {dispatches:,} dispatches", f"+{grown} bytes",
             "bounded by keys", ok and grown < 4096)]


def oracle(quick: bool) -> list[Row]:
    """Arbiter's pick against the fastest candidate, each measured afresh, over a sweep."""
    reg = CandidateRegistry()
    register_bundled(reg)
    shapes = [(s, s, s) for s in (8, 16, 32, 64, 128, 256, 512)]
    shapes += [(1, 1024, 1024), (1024, 1, 1024), (4, 2048, 256), (2048, 4, 256),
               (512, 8, 512), (8, 512, 512), (16, 1024, 256), (256, 16, 1024),
               (33, 17, 65), (100, 37, 250), (257, 129, 511), (24, 16, 32), (500, 300, 200),
               (7, 7, 4096), (1000, 10, 100), (10, 1000, 100), (64, 256, 1024),
               (256, 1024, 256), (1, 4096, 512), (128, 128, 2048), (300, 300, 300),
               (48, 48, 768), (96, 800, 96)]
    dtypes = ["float32"] if quick else ["float32", "float16", "bfloat16"]
    rng = np.random.default_rng(0)
    within, worst, total = 0, 1.0, 0
    for dtype in dtypes:
        for m, n, k in shapes:
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            pool = [c for c in reg.for_op("matmul") if c.accepts(a, b)]
            sel = measured_arbitrate("matmul", (a, b), pool, MeasureCache())
            assert sel.candidate is not None
            fns: list[Callable[[], object]] = [
                (lambda c=c, a=a, b=b: c.run(a, b)) for c in pool]  # type: ignore[misc]
            inner = max(1, int(2e5 / (m * n * k) + 1))
            medians = _interleaved_medians(fns, rounds=15, inner=inner)
            picked = medians[pool.index(sel.candidate)]
            ratio = picked / min(medians)
            total += 1
            within += ratio <= 1.05
            worst = max(worst, ratio)
    share = within / total
    return [(f"oracle: pick within 5% of best ({total} shape/dtype cases)", f"{share:.0%}",
             ">= 90%", share >= 0.9),
            ("oracle: worst pick / best", f"{worst:.2f}x", "<= 1.25x", worst <= 1.25)]


def artifacts_scale() -> list[Row]:
    bench_merge = Path(__file__).with_name("bench_merge.py")
    if not bench_merge.exists():
        return [("artifacts: 100k-entry load and merge", "bench/bench_merge.py missing",
                 "< 1 s", False)]
    out = subprocess.run([sys.executable, str(bench_merge)], capture_output=True, text=True)
    text = (out.stdout.strip().splitlines() or ["no output"])[-1]
    return [("artifacts: 100k-entry load and merge", text, "< 1 s each", out.returncode == 0)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer trials, float32 only")
    args = parser.parse_args()
    rows: list[Row] = []
    rows += hot_path()
    rows += tuner(50 if args.quick else 200)
    rows += histogram_memory(1_000_000)
    rows += oracle(args.quick)
    rows += idle_plugin(500 if args.quick else 2000)
    rows += artifacts_scale()
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'measured':<50}  {'target':<16}  ok")
    for name, measured, target, ok in rows:
        print(f"{name:<{width}}  {measured:<50}  {target:<16}  {'yes' if ok else 'NO'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
