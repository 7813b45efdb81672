"""The fleet corpus at scale: load and merge 100k cache entries.

Run: python bench/bench_merge.py [--entries N] [--repeat R]
Builds two shards of N realistic entries (a quarter of the second one's keys are also
in the first, measured on another runner), writes them with the real writer, then
times the real reader (``artifacts.read_cache``) on the first and ``corpus.merge`` of
both. Prints the best of R repeats as its last line and exits 0 only when load and
merge each take under a second. bench/run_all.py shows that line.

The load includes reading the file, decoding and validating every entry (one msgspec
pass into the schema's structs; see docs/artifacts.md) and building the cache's dict.
The entries carry what the tuner writes: a ranking of one to four candidates, the
candidates considered with their fingerprints, the environment, ``since``, and the
provenance (host, device name, versions, time, rounds, timed_ns, spent_ns, p_value,
shapes). The garbage collector stays on, as in a pytest run: the entries leave it
nothing to walk. bench/bench_store.py compares this with the version 2 format.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import (
    CACHE_SCHEMA,
    CACHE_VERSION,
    CacheEntry,
    Considered,
    MeasureCache,
    shapes_text,
)
from pytest_arbiter.store.cache_file import convert_document
from pytest_arbiter.store.corpus import merge

DEVICES = (("sm_120", "nvidia", "NVIDIA RTX PRO 6000"), ("sm_90", "nvidia", "NVIDIA H100"),
           ("gfx1151", "amd", "AMD Radeon 8060S"), ("cpu-x86_64-avx2", "cpu", "AMD EPYC"))
CANDIDATES = {"matmul": ("cublas_gemm", "tiled_sgemm", "wmma_gemm", "reference_matmul"),
              "softmax": ("stable_softmax", "online_softmax", "reference_softmax")}
VERSIONS = {"pytest-arbiter": "0.1.0", "numpy": "2.1.3", "python": "3.12.7"}
SINCE_TEXT = "2026-12-01T06:00:00Z"


def environment(target: str, device_name: str) -> dict[str, str]:
    env = {"device_name": device_name, "numpy": "2.1.3", "python": "3.12.7",
           "blas": "scipy-openblas 0.3.28"}
    if target != "cpu":
        env.update(cupy="14.0.0", cuda_runtime="12080", driver="12090",
                   blas_library="cublas 120804")
    return env


def considered(op: str, host: str) -> dict[str, Considered]:
    """Every candidate of ``op`` with a fingerprint (one code version per host)."""
    return {name: Considered(hashlib.blake2b(f"{name}/{host}".encode(), digest_size=8)
                             .hexdigest(), "timed")
            for name in CANDIDATES[op]}


def entry_fields(n: int, *, seed: int, host: str, start: int = 0) -> list[dict[str, Any]]:
    """The values of ``n`` entries with keys ``start`` .. ``start + n``, as a tuning run
    measures them (plain values, so that bench/bench_store.py can build the entries of
    either format from them)."""
    rnd = random.Random(seed)
    out = []
    for i in range(start, start + n):
        device, target, device_name = DEVICES[i % len(DEVICES)]
        op = "matmul" if i % 3 else "softmax"
        names = list(CANDIDATES[op])
        rnd.shuffle(names)
        base = float(rnd.randint(2_000, 5_000_000))
        ranking = []
        for j, name in enumerate(names[:rnd.randint(1, len(names))]):
            median = round(base * (1 + 0.15 * j))
            ranking.append((name, median, round(median * 0.93), round(median * 0.97),
                            round(median * 1.04), round(median * 1.4), rnd.randint(7, 200)))
        out.append({
            "device": device, "target": target, "op": op,
            "bucket": f"m{2 ** (i % 13)}-n{2 ** (i // 13 % 11)}-k{i // 143}",
            "dtype": ("float32", "float16", "bfloat16")[i % 3], "ranking": ranking,
            "confidence": round(rnd.uniform(0.9, 1.0), 4),
            "provenance": {
                "host": host, "device_name": device_name, "versions": VERSIONS,
                "measured_at": f"2026-12-03T0{i % 4}:1{i % 6}:00Z",
                "shapes": [[64, 32], [32, 16]] if op == "matmul" else [[64, 32]],
                "rounds": rnd.randint(7, 200), "timed_ns": rnd.randint(10**5, 10**7),
                "spent_ns": rnd.randint(10**6, 10**8),
                "p_value": rnd.randint(1, 99) * 0.5 ** rnd.randint(7, 20)},
        })
    return out


STATS = ("median_ns", "min_ns", "q1_ns", "q3_ns", "max_ns", "samples")


def make_entries(n: int, *, seed: int, host: str, start: int = 0) -> list[CacheEntry]:
    """``n`` entries with keys ``start`` .. ``start + n``, as a tuning run writes them.

    Built as a tuning run's xdist payload is read (``cache_file.convert_document`` of the
    document's builtins: each entry validated, the shared rows shared): a million in a
    minute, where building each through ``CacheEntry(...)`` (which checks it through
    the schema one by one) takes several.
    """
    environments = {(t, d): i for i, (_, t, d) in enumerate(DEVICES)}
    ops = list(CANDIDATES)
    runs = [{"host": host, "device_name": d, "versions": VERSIONS} for _, _, d in DEVICES]
    entries = []
    for f in entry_fields(n, seed=seed, host=host, start=start):
        prov = dict(f["provenance"])
        device_name = prov.pop("device_name")
        del prov["host"], prov["versions"]
        prov["run"] = environments[f["target"], device_name]
        prov["shapes"] = shapes_text(prov["shapes"])
        entries.append({
            "device": f["device"], "target": f["target"], "op": f["op"],
            "bucket": f["bucket"], "dtype": f["dtype"],
            "ranking": [{"name": r[0], "stats": dict(zip(STATS, r[1:], strict=True))}
                        for r in f["ranking"]],
            "confidence": f["confidence"], "provenance": prov,
            "considered": ops.index(f["op"]),
            "environment": environments[f["target"], device_name], "since": SINCE_TEXT})
    document = {
        "schema": CACHE_SCHEMA, "version": CACHE_VERSION, "runs": runs,
        "environments": [environment(t, d) for _, t, d in DEVICES],
        "considered": [msgspec.to_builtins(considered(op, host)) for op in ops],
        "entries": entries}
    return convert_document(document)


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
    load, merged = min(loads), min(merges)
    busy = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"loads: {', '.join(f'{t:.2f}' for t in loads)} s; merges: "
          f"{', '.join(f'{t:.2f}' for t in merges)} s; write {write_s:.2f} s "
          f"({size_mb:.0f} MB); load average {busy} on {os.cpu_count()} CPUs")
    print(f"load {load:.2f} s, merge {merged:.2f} s ({n:,} entries, best of {args.repeat})")
    return 0 if load < 1.0 and merged < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
