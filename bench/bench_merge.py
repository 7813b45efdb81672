"""The fleet corpus at scale: load and merge 100k cache entries.

Run: python bench/bench_merge.py [--entries N] [--repeat R]
Builds two shards of N realistic entries (a quarter of the second one's keys are also
in the first, measured on another runner), writes them with the real writer, then
times the real reader (``artifacts.read_cache``) on the first and ``corpus.merge`` of
both. Prints the best of R repeats as its last line and exits 0 only when load and
merge each take under a second. bench/run_all.py shows that line.

The load includes reading the file, parsing the JSON and validating every entry
(column by column and all ranking rows at once, in C loops; see docs/artifacts.md); an
entry builds its ranking and provenance objects on first use, and the merge compares
only the keys both shards hold. The entries carry the provenance the tuner writes
(rounds, timed_ns, spent_ns, p_value, shapes and a ``runs`` row). The second-to-last
line prints every repeat and the load average.

The cyclic garbage collector is off while timing, as in the ``pytest-arbiter`` CLI
(which does the merging at scale): with it on, collections triggered by whatever
allocates next rescan the million objects a 100k-entry load creates, and that cost
lands on the next timed step at random.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from pytest_arbiter import artifacts
from pytest_arbiter.cache import CacheEntry, MeasureCache, RankedCandidate
from pytest_arbiter.corpus import merge
from pytest_arbiter.measure import LatencyStats

DEVICES = (("sm_120", "nvidia", "NVIDIA RTX PRO 6000"), ("sm_90", "nvidia", "NVIDIA H100"),
           ("gfx1151", "amd", "AMD Radeon 8060S"), ("cpu-x86_64-avx2", "cpu", "AMD EPYC"))
CANDIDATES = {"matmul": ("cublas_gemm", "tiled_sgemm", "wmma_gemm", "reference_matmul"),
              "softmax": ("stable_softmax", "online_softmax", "reference_softmax")}


def _stats(rnd: random.Random, median: float) -> LatencyStats:
    samples = rnd.randint(7, 200)
    return LatencyStats(median, median * 0.93, median * 0.97, median * 1.04, median * 1.4,
                        samples)


def make_entries(n: int, *, seed: int, host: str, start: int = 0) -> list[CacheEntry]:
    """``n`` entries with keys ``start`` .. ``start + n``, as a tuning run writes them."""
    rnd = random.Random(seed)
    out = []
    for i in range(start, start + n):
        device, target, device_name = DEVICES[i % len(DEVICES)]
        op = "matmul" if i % 3 else "softmax"
        names = list(CANDIDATES[op])
        rnd.shuffle(names)
        base = rnd.uniform(2e3, 5e6)
        ranking = tuple(RankedCandidate(name, _stats(rnd, base * (1 + 0.15 * j)))
                        for j, name in enumerate(names[:rnd.randint(1, len(names))]))
        prov = {"host": host, "device_name": device_name,
                "versions": {"pytest-arbiter": "0.1.0", "numpy": "2.1.3", "python": "3.12.7"},
                "measured_at": f"2026-12-03T0{i % 4}:1{i % 6}:00Z",
                "shapes": [[64, 32], [32, 16]] if op == "matmul" else [[64, 32]],
                "rounds": rnd.randint(7, 200), "timed_ns": rnd.randint(10**5, 10**7),
                "spent_ns": rnd.randint(10**6, 10**8),
                "p_value": rnd.randint(1, 99) * 0.5 ** rnd.randint(7, 20)}
        bucket = f"m{2 ** (i % 13)}-n{2 ** (i // 13 % 11)}-k{i // 143}"
        dtype = ("float32", "float16", "bfloat16")[i % 3]
        out.append(CacheEntry(device, target, op, bucket, dtype, ranking,
                              round(rnd.uniform(0.9, 1.0), 4), False, {}, prov))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    n = args.entries
    with tempfile.TemporaryDirectory() as tmp:
        first, second = Path(tmp, "a.json"), Path(tmp, "b.json")
        shard_a = MeasureCache(make_entries(n, seed=1, host="runner-a"))
        shard_b = MeasureCache(make_entries(n, seed=2, host="runner-b", start=n * 3 // 4))
        start = time.perf_counter()
        artifacts.write_cache(first, shard_a)
        write_s = time.perf_counter() - start
        artifacts.write_cache(second, shard_b)
        size_mb = first.stat().st_size / 1e6
        del shard_a, shard_b
        loads, merges = [], []
        gc.collect()
        gc.disable()
        for _ in range(args.repeat):
            start = time.perf_counter()
            a = artifacts.read_cache(first)
            loads.append(time.perf_counter() - start)
            b = artifacts.read_cache(second)
            start = time.perf_counter()
            result = merge(a, b)
            merges.append(time.perf_counter() - start)
            assert len(a) == n and len(result.entries) == n + n * 3 // 4
            del a, b, result
        gc.enable()
    load, merged = min(loads), min(merges)
    busy = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"loads: {', '.join(f'{t:.2f}' for t in loads)} s; merges: "
          f"{', '.join(f'{t:.2f}' for t in merges)} s; write {write_s:.2f} s "
          f"({size_mb:.0f} MB); load average {busy} on {os.cpu_count()} CPUs")
    print(f"load {load:.2f} s, merge {merged:.2f} s ({n:,} entries, best of {args.repeat}, "
          "GC off as in the CLI)")
    return 0 if load < 1.0 and merged < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
