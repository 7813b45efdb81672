"""Every performance figure of docs/performance.md, measured side by side in one run.

Run: python bench/run_all.py [--quick] [--only hot_path,idle_plugin]
Prints a compact table: each figure beside its target. Timing lives here, never in the
default test run, because the machines this runs on are shared and noisy. The hot path
of a user op (``pytest_arbiter.dispatch`` and ``Arbiter.dispatch`` against a direct
call and a dict-lookup floor, and over 1 to 100k distinct shapes) is in ``hot_path.py``.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import resource
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
from pytest_arbiter.core.candidates import Candidate, CandidateRegistry, FunctionCandidate
from pytest_arbiter.core.dtypes import numpy_dtype
from pytest_arbiter.core.ops import Op, make_op
from pytest_arbiter.gating.histogram import DispatchHistogram
from pytest_arbiter.runtime import register_bundled

# bench/ is not a package: its sibling module is found on the script's own folder
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hot_path import Row, hot_path_rows

SECTIONS = ("hot_path", "tuner", "histogram", "oracle", "idle_plugin", "artifacts")


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


def matmul_hot_path() -> list[Row]:
    """A cache-hit dispatch of a 16x16 float32 matmul against a direct call of the winner
    (a ``tune``-mode, gated ``Arbiter`` on the bundled candidates; the row kept from
    before the dispatch rewrite, so its figures compare across versions)."""
    arb = Arbiter(mode="tune")
    a = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    arb.dispatch("matmul", a, b)
    winner = arb.registry.get(arb.cache.entries()[0].winner)
    direct, dispatched = _interleaved_medians(
        [lambda: winner.run(a, b), lambda: arb.dispatch("matmul", a, b)], rounds=41, inner=2000)
    extra = dispatched - direct
    return [("hot path: Arbiter.dispatch - direct (16x16 f32 matmul)", f"{extra:.0f} ns "
             f"(direct {direct:.0f} ns, ratio {dispatched / direct:.2f})", "<= 1500 ns",
             extra <= 1500)]


def _paired_gap(fast: Callable[[], object], slow: Callable[[], object], rounds: int) -> float:
    """Median over rounds of slow's time over fast's, the two alternating in each round."""
    clock = time.perf_counter_ns
    ratios = []
    for i in range(rounds):
        times = [0.0, 0.0]
        for j in ((0, 1) if i % 2 else (1, 0)):
            start = clock()
            (fast, slow)[j]()
            times[j] = float(clock() - start)
        ratios.append(times[1] / times[0])
    return statistics.median(ratios) - 1.0


def _padded(kernel: Callable[..., object], args: tuple[object, ...], gap: float,
            pad_of: Callable[[int], Callable[[], object]], sizes: tuple[int, int],
            ) -> tuple[Callable[..., object], float]:
    """``kernel`` plus a pad of the same kind of work (``pad_of(size)``) costing ``gap``.

    The slower twin does the same work and a little more (real work, not a sleep), so
    both stay correct, and the pad slows down with the kernel when the machine is
    busy. The pad size is calibrated here, side by side (paired rounds, the size scaled
    until the gap is within half a percent of ``gap``), and the measured gap is returned
    so the table shows what was actually compared.
    """

    def with_pad(size: int) -> Callable[..., object]:
        pad = pad_of(size)

        def slower(*inputs: object) -> object:
            pad()
            return kernel(*inputs)

        return slower

    lo, hi = sizes
    size, measured = max(lo, hi // 8), 0.0
    for _ in range(8):
        fn = with_pad(size)
        measured = _paired_gap(lambda: kernel(*args), lambda f=fn: f(*args), 151)  # type: ignore[misc]
        if abs(measured - gap) < 0.005:
            break
        scale = gap / measured if measured > 0.002 else 2.0
        size = max(lo, min(hi, round(size * min(max(scale, 0.25), 4.0))))
    return with_pad(size), measured


def _tuner_pair(kind: str) -> tuple[Op | str, tuple[np.ndarray, ...], list[Candidate], float,
                                     float]:
    """Two correct candidates ~100 us each, the second one 5% slower but a higher tier.

    The higher tier on the slower one makes a wrongly declared tie a wrong pick.
    """
    rng = np.random.default_rng(0)
    if kind == "reduction":
        x = rng.standard_normal(600_000)
        scratch = rng.standard_normal(200_000)

        def fast(v: np.ndarray) -> np.ndarray:
            return np.asarray(np.add.reduce(v))

        def pad_of(size: int) -> Callable[[], object]:
            part = scratch[:size]
            return lambda: np.add.reduce(part)

        inputs: tuple[np.ndarray, ...] = (x,)
        sizes = (1, len(scratch))
        the_op: Op | str = make_op("bench_sum", lambda v: np.asarray(np.add.reduce(v)))
    else:
        a, b = rng.standard_normal((132, 132)), rng.standard_normal((132, 132))
        s1, s2 = rng.standard_normal((132, 132)), rng.standard_normal((132, 66))

        def fast(a: np.ndarray, b: np.ndarray) -> np.ndarray:  # type: ignore[misc]
            out: np.ndarray = np.dot(a, b)
            return out

        def pad_of(size: int) -> Callable[[], object]:
            part = np.ascontiguousarray(s2[:, :size])
            return lambda: np.dot(s1, part)

        inputs = (a, b)
        sizes = (1, 66)
        the_op = "matmul"
    slow, gap = _padded(fast, inputs, 0.05, pad_of, sizes)
    op_name = the_op if isinstance(the_op, str) else the_op.name
    cands: list[Candidate] = [
        FunctionCandidate(fast, "fast", op_name, "cpu", 0, None, None),
        FunctionCandidate(slow, "slow", op_name, "cpu", 1, None, None)]
    kernel_us = statistics.median(_interleaved_medians([lambda: fast(*inputs)], 21, 5)) / 1e3
    return the_op, inputs, cands, gap, kernel_us


def tuner(trials: int) -> list[Row]:
    """``measured_arbitrate`` (gate, then interleaved rounds) on two candidates 5% apart.

    Each trial is a fresh cache, so each measures; the faster candidate must win. The
    timing spent is the comparison's wall time, warmup included (``Comparison.spent_ns``),
    and, for reference, the sum of the timed calls alone.
    """
    rows: list[Row] = []
    for kind in ("reduction", "matmul"):
        op, inputs, cands, gap, kernel_us = _tuner_pair(kind)
        right = ties = 0
        spent: list[float] = []
        timed: list[float] = []
        seen: list[float] = []
        for trial in range(trials):
            sel = measured_arbitrate(op, inputs, cands, MeasureCache(),
                                     policy=ComparePolicy(seed=trial))
            comp = sel.comparison
            assert comp is not None and sel.candidate is not None
            right += sel.candidate.name == "fast"
            ties += comp.tie
            seen.append(comp.ratios["slow"] / comp.ratios["fast"] - 1.0)
            spent.append(comp.spent_ns / 1e6)
            timed.append(comp.timed_ns / 1e6)
        share = right / trials
        over = sum(1 for t in spent if t > 10.0)
        rows += [
            (f"tuner ({kind}s): picks the 5%-faster of two", f"{share:.1%} of {trials}, "
             f"{ties} ties (kernel ~{kernel_us:.0f} us, gap {gap:+.1%} calibrated, "
             f"{statistics.median(seen):+.1%} in the trials)", ">= 99%",
             share >= 0.99),
            (f"tuner ({kind}s): timing spent per pair", f"median {statistics.median(spent):.1f}"
             f" ms, max {max(spent):.1f} ms ({over} over 10 ms); timed calls max "
             f"{max(timed):.1f} ms", "<= 10 ms", max(spent) <= 10.0),
        ]
    return rows


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
            """CPU seconds (user + system) of one pytest run: less exposed than wall time
            to the other tenants of a shared machine."""
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            *extra], cwd=tmp, env=env, check=True, capture_output=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

        def python(code: str) -> float:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env, check=True)
            return time.perf_counter() - start

        with_plugin: list[float] = []
        without: list[float] = []
        imports: list[float] = []
        for round_ in range(15):
            # alternate which goes first, so a drift or a warm-up favours neither
            if round_ % 2:
                without.append(run("-p", "no:arbiter"))
                with_plugin.append(run())
            else:
                with_plugin.append(run())
                without.append(run("-p", "no:arbiter"))
            # what loading the plugin module costs by itself
            imports.append(python("import pytest, pytest_arbiter.plugin")
                           - python("import pytest"))
    # judged on the median of the rounds' paired ratios (a drift of the shared machine
    # hits both runs of a round alike); the ratios of medians and of minima are shown
    paired = statistics.median(w / o for w, o in zip(with_plugin, without, strict=True))
    ratio = statistics.median(with_plugin) / statistics.median(without)
    by_min = min(with_plugin) / min(without)
    return [(f"idle plugin: {tests} trivial tests", f"{paired:.3f}x paired median "
             f"({ratio:.3f}x of medians, {by_min:.3f}x of minima; "
             f"CPU {statistics.median(with_plugin):.2f} s vs {statistics.median(without):.2f} s;"
             f" import {statistics.median(imports) * 1e3:.0f} ms)",
             "<= 1.05x", paired <= 1.05)]


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


def _afresh(fns: list[Callable[[], object]], picked: int, inner: int, rounds: int = 31,
            ) -> tuple[list[float], list[float]]:
    """Re-measure candidates against the picked one: paired ratios and minima ratios.

    Rounds run every candidate once in a shuffled order, with the garbage collector off;
    a candidate's figure is its median over rounds of its time over the picked one's
    time in the same round (so a burst of load that hits a round hits both), and, as a
    cross-check, its minimum over the picked one's minimum.
    """
    order = list(range(len(fns)))
    shuffle = random.Random(1)
    samples: list[list[float]] = [[] for _ in fns]
    clock = time.perf_counter_ns
    gc.disable()
    try:
        for fn in fns:
            fn()
        for _ in range(rounds):
            shuffle.shuffle(order)
            for i in order:
                start = clock()
                for _ in range(inner):
                    fns[i]()
                samples[i].append((clock() - start) / inner)
    finally:
        gc.enable()
    mine = samples[picked]
    paired = [statistics.median(t / p for t, p in zip(s, mine, strict=True)) for s in samples]
    minima = [min(s) / min(mine) for s in samples]
    return paired, minima


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
    within, total = 0, 0
    worst, worst_case = 1.0, "-"
    for dtype in dtypes:
        for m, n, k in shapes:
            a = rng.standard_normal((m, k)).astype(numpy_dtype(dtype))
            b = rng.standard_normal((k, n)).astype(numpy_dtype(dtype))
            pool = [c for c in reg.for_op("matmul", "cpu") if c.available() and c.accepts(a, b)]
            sel = measured_arbitrate("matmul", (a, b), pool, MeasureCache())
            assert sel.candidate is not None
            fns: list[Callable[[], object]] = [
                (lambda c=c, a=a, b=b: c.run(a, b)) for c in pool]  # type: ignore[misc]
            inner = max(1, int(2e5 / (m * n * k) + 1))
            ratios, by_min = _afresh(fns, pool.index(sel.candidate), inner)
            best = pool[ratios.index(min(ratios))]
            ratio = 1.0 / min(ratios)
            total += 1
            within += ratio <= 1.05
            case = (f"{m}x{n}x{k} {dtype}: picked {sel.candidate.name}, best {best.name}, "
                    f"{ratio:.2f}x")
            if ratio > 1.05:
                tuned = ({n_: round(r, 3) for n_, r in sel.comparison.ratios.items()}
                         if sel.comparison else {})
                print(f"  oracle miss: {case}; by the minima {1.0 / min(by_min):.2f}x; "
                      f"the tuner's paired ratios {tuned}", file=sys.stderr)
            if ratio > worst:
                worst, worst_case = ratio, case
    share = within / total
    return [(f"oracle: pick within 5% of best ({total} shape/dtype cases)", f"{share:.0%}",
             ">= 90%", share >= 0.9),
            ("oracle: worst pick / best", f"{worst:.2f}x ({worst_case})" if worst > 1.0
             else f"{worst:.2f}x", "<= 1.25x", worst <= 1.25)]


def artifacts_scale() -> list[Row]:
    bench_merge = Path(__file__).with_name("bench_merge.py")
    if not bench_merge.exists():
        return [("artifacts: 100k-entry load and merge", "bench/bench_merge.py missing",
                 "< 1 s", False)]
    out = subprocess.run([sys.executable, str(bench_merge)], capture_output=True, text=True)
    text = (out.stdout.strip().splitlines() or ["no output"])[-1]
    return [("artifacts: 100k-entry load and merge", text, "< 1 s each", out.returncode == 0)]


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (f"{model}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, "
            f"NumPy {np.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer trials, float32 only")
    parser.add_argument("--blas-threads", type=int, default=1, metavar="N",
                        help="OpenBLAS threads (default 1; 0 keeps the library's default). "
                             "See docs/performance.md: on a shared 2-core machine a threaded "
                             "GEMV swings 100x with the neighbours' load")
    parser.add_argument("--only", default=",".join(SECTIONS), metavar="LIST",
                        help=f"comma-separated sections to run (default all: "
                             f"{','.join(SECTIONS)})")
    args = parser.parse_args()
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; sections: "
                     f"{', '.join(SECTIONS)}")
    wanted = "" if args.blas_threads == 0 else str(args.blas_threads)
    if os.environ.get("OPENBLAS_NUM_THREADS", "") != wanted:
        # the thread count is read when NumPy loads: run again with it set
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
        if wanted:
            env["OPENBLAS_NUM_THREADS"] = wanted
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    print(f"machine: {_machine()}; OpenBLAS threads: {wanted or 'library default'}")
    print(f"load average at start: {_loadavg()}")
    rows: list[Row] = []
    if "hot_path" in only:
        rows += matmul_hot_path()
        rows += hot_path_rows(args.quick)
    if "tuner" in only:
        rows += tuner(50 if args.quick else 200)
    if "histogram" in only:
        rows += histogram_memory(1_000_000)
    if "oracle" in only:
        rows += oracle(args.quick)
    if "idle_plugin" in only:
        rows += idle_plugin(500 if args.quick else 2000)
    if "artifacts" in only:
        rows += artifacts_scale()
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'measured':<50}  {'target':<16}  ok")
    for name, measured, target, ok in rows:
        met = "-" if ok is None else "yes" if ok else "NO"
        print(f"{name:<{width}}  {measured:<50}  {target:<16}  {met}")
    print(f"load average at end: {_loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
