"""Tuning at scale (issue 26, point 2): N keys x M candidates measured at first miss,
against the same dispatches without tuning, and where the tuning's time goes.

One user op (``x * 2`` on float32) with M function candidates; candidate ``i`` does the
multiply ``1 + i`` times, so every comparison has a clear, known order and the kernels
cost microseconds, as small real kernels do. N keys: N 3-D input shapes of distinct
cache buckets, the smallest there are (at most 16x16x32). Each run dispatches every
key ``--calls`` times through ``pytest_arbiter.dispatch``, on a process arbiter
configured afresh (``pytest_arbiter.configure``, an empty in-memory cache, the gate on
as in a pytest run):

* ``static``: no tuning; each key's tier-order candidate is gated, then runs;
* ``tune``: each key's candidates are gated and timed side by side at its first miss.

One key of another shape is dispatched in both modes first, unmeasured, so the
once-per-process work (the environment's probe, each candidate's fingerprint) is shown
apart. The figures: each run's wall time, the ratio (target: tune at most 1.5x the
static run), the added cost per key and per key and candidate, and the kernels' own
time in the comparisons (the entries' ``timed_ns``) beside the comparisons' wall time
(``spent_ns``). ``--profile FILE`` profiles the tuning run with cProfile, dumps it to
FILE and prints its top functions.

``--pytest``: the same keys as a pytest project (one test per key, in a temporary
folder), run in fresh processes as plain ``pytest`` and as ``pytest --arbiter-tune
--arbiter-cache=FILE``: what the issue's "26 s against 8.6 s" compares, pytest's own
cost per test and the cache file's write included (wall and CPU time of each run).

Run: ``python bench/tune_scale.py`` (1,000 x 16, about a minute), ``--quick`` (100 x 16),
``--pytest``, ``--before DIR`` for an older tree first (bench/trees.py).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import itertools
import json
import os
import pstats
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from trees import BEFORE_HELP, header, load_average, run_before

import pytest_arbiter

OP = "bench_tune_scale"
RATIO_TARGET = 1.5
ALIGN = (16, 16, 16)
"""What the candidates declare they need: the shapes' alignment classes up to 16 are
keys of their own, so the 1,000 small shapes are 1,000 keys, the same in every tree this
script times."""


def twice(x: np.ndarray) -> np.ndarray:
    """The reference: ``x * 2``."""
    return x * 2.0


def twice_repeated(extra: int, x: np.ndarray) -> np.ndarray:
    """A candidate: ``x * 2``, computed ``1 + extra`` times into the same output."""
    out = np.multiply(x, 2.0)
    for _ in range(extra):
        np.multiply(x, 2.0, out=out)
    return out


def register(candidates: int) -> list[str]:
    """The op and its candidates (a partial each: a distinct fingerprint each)."""
    pytest_arbiter.op(OP, reference=twice)
    names = [f"bench_tune_{i:02d}" for i in range(candidates)]
    for i, name in enumerate(names):
        pytest_arbiter.candidate(OP, target="cpu", name=name, align=ALIGN)(
            functools.partial(twice_repeated, i))
    return names


def shapes(n: int) -> list[tuple[int, int, int]]:
    """The ``n`` smallest 3-D shapes of distinct cache buckets (the op's own bucketing)."""
    seen: dict[str, tuple[int, int, int]] = {}
    for shape in sorted(itertools.product(range(1, 17), range(1, 17), range(1, 33)),
                        key=lambda s: (s[0] * s[1] * s[2], s)):
        bucket = pytest_arbiter.Region(OP, (shape,), "float32").bucket(ALIGN)
        seen.setdefault(bucket, shape)
        if len(seen) == n:
            break
    if len(seen) < n:
        raise SystemExit(f"only {len(seen)} distinct buckets of 3-D shapes up to 16x16x32")
    return list(seen.values())


def inputs_of(keys: int) -> list[np.ndarray]:
    """One seeded float32 input per key."""
    return [np.random.default_rng(i).standard_normal(s, dtype=np.float32)
            for i, s in enumerate(shapes(keys))]


def run(mode: pytest_arbiter.Mode, inputs: Sequence[np.ndarray], calls: int,
        profile: cProfile.Profile | None = None
        ) -> tuple[float, pytest_arbiter.Arbiter, float]:
    """Dispatch every input ``calls`` times on a fresh process arbiter in ``mode``: the
    wall time, the arbiter, and the process's CPU time (less noisy on a shared machine)."""
    arb = pytest_arbiter.configure(cache=pytest_arbiter.MeasureCache(), mode=mode, gate=True)
    dispatch = pytest_arbiter.dispatch
    if profile is not None:
        profile.enable()
    start, cpu = time.perf_counter(), time.process_time()
    for x in inputs:
        for _ in range(calls):
            dispatch(OP, x)
    took, cpu = time.perf_counter() - start, time.process_time() - cpu
    if profile is not None:
        profile.disable()
    return took, arb, cpu


def check(arb: pytest_arbiter.Arbiter, names: Sequence[str], dispatches: int,
          entries: int) -> str:
    """What the run did, if not what it should: every dispatch won by a candidate, and
    (tuning) one entry per key won by the cheapest candidate."""
    counts = arb.histogram.counts(op=OP)
    won = sum(v for k, v in counts.items() if k.outcome == "won")
    problems = [] if won == dispatches else [f"{won} of {dispatches} dispatches won"]
    found = [e for e in arb.cache if e.op == OP]
    if len(found) != entries:
        problems.append(f"{len(found)} entries, not {entries}")
    wrong = sum(e.winner != names[0] for e in found)
    if wrong:
        problems.append(f"{wrong} keys not won by {names[0]} (the cheapest)")
    return "; ".join(problems)


def kernel_time(arb: pytest_arbiter.Arbiter) -> tuple[float, float]:
    """Seconds the comparisons spent in the kernels' timed calls, and in all."""
    found = [e for e in arb.cache if e.op == OP]
    timed = sum(_provenance_ns(e, "timed_ns") for e in found)
    spent = sum(_provenance_ns(e, "spent_ns") for e in found)
    return timed / 1e9, spent / 1e9


def _provenance_ns(entry: pytest_arbiter.CacheEntry, name: str) -> float:
    value = getattr(entry.provenance, name, None)
    return float(value) if isinstance(value, (int, float)) else 0.0


CONFTEST = """
import sys
sys.path.insert(0, {bench!r})
from tune_scale import register
register({candidates})
"""
TESTS = """
import pytest
import pytest_arbiter
from tune_scale import OP, inputs_of
INPUTS = inputs_of({keys})


@pytest.mark.parametrize("i", range({keys}))
def test_key(i):
    for _ in range({calls}):
        pytest_arbiter.dispatch(OP, INPUTS[i])
"""


def pytest_runs(keys: int, candidates: int, calls: int, profile: str | None) -> None:
    """Plain ``pytest`` and ``pytest --arbiter-tune`` on a project of ``keys`` tests, in
    fresh processes: wall and CPU time of each, the cache file's entries checked."""
    with tempfile.TemporaryDirectory(prefix="tune-scale-") as tmp:
        project = Path(tmp)
        bench = str(Path(__file__).resolve().parent)
        (project / "conftest.py").write_text(CONFTEST.format(bench=bench, candidates=candidates))
        (project / "test_keys.py").write_text(TESTS.format(keys=keys, calls=calls))
        cache = project / "cache.json"
        times: dict[str, tuple[float, float]] = {}
        for label, extra in (("plain pytest", []), ("pytest --arbiter-tune",
                                                   ["--arbiter-tune", f"--arbiter-cache={cache}"])):
            runner = ["-m", "cProfile", "-o", str(Path(profile).resolve())] if (
                profile and extra) else []
            cpu = _children_cpu()
            start = time.perf_counter()
            done = subprocess.run([sys.executable, *runner, "-m", "pytest", "-q", "-p",
                                   "no:cacheprovider", *extra], cwd=project, env=os.environ,
                                  capture_output=True, text=True, check=False)
            times[label] = (time.perf_counter() - start, _children_cpu() - cpu)
            last = (done.stdout.strip().splitlines() or ["?"])[-1]
            print(f"{label:<22}  wall {times[label][0]:6.2f} s, CPU {times[label][1]:6.2f} s"
                  f"  ({last}; exit {done.returncode})", flush=True)
        entries = len(json.loads(cache.read_text()).get("entries", [])) if cache.exists() else 0
        (plain, _), (tuned, _) = times.values()
        ratio = tuned / plain
        print(f"{'tune / plain':<22}  {ratio:.2f}x wall (target <= {RATIO_TARGET}x: "
              f"{'met' if ratio <= RATIO_TARGET else 'NOT met'}); {entries} entries written"
              f"{'' if entries == keys else f', NOT {keys}'}")
    if profile:
        print_profile(None, profile, 25)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def print_profile(profile: cProfile.Profile | None, path: str, top: int) -> None:
    if profile is not None:
        profile.dump_stats(path)
    stats = pstats.Stats(path)
    stats.strip_dirs()
    for key in ("tottime", "cumulative"):
        print(f"\ncProfile of the tuning run ({path}), top {top} by {key}:")
        stats.sort_stats(key).print_stats(top)


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--candidates", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="100 keys (and --candidates)")
    parser.add_argument("--calls", type=int, default=1, help="dispatches per key")
    parser.add_argument("--profile", metavar="FILE", help="cProfile the tuning run into FILE")
    parser.add_argument("--top", type=int, default=25, help="profile rows printed")
    parser.add_argument("--pytest", action="store_true",
                        help="as pytest projects in fresh processes (plain vs --arbiter-tune)")
    parser.add_argument("--before", metavar="DIR", help=BEFORE_HELP)
    args = parser.parse_args(args_in)
    if args.before:
        run_before(args.before, __file__, args_in)
    keys = 100 if args.quick else args.keys
    print(header())
    print(f"{keys:,} keys x {args.candidates} candidates, {args.calls} dispatch(es) per key"
          f"{', pytest runs' if args.pytest else ', in this process'}")
    if args.pytest:
        pytest_runs(keys, args.candidates, args.calls, args.profile)
        return 0
    names = register(args.candidates)
    inputs = inputs_of(keys)
    first = np.ones(3, dtype=np.float32)
    warm: dict[str, float] = {}
    for mode in ("static", "tune"):
        warm[mode] = run(mode, [first], 1)[0]
    print(f"once per process (one other key, unmeasured): static {warm['static']:.3f} s, "
          f"tune {warm['tune']:.3f} s")
    static_s, static_arb, static_cpu = run("static", inputs, args.calls)
    profile = cProfile.Profile() if args.profile else None
    tune_s, tune_arb, tune_cpu = run("tune", inputs, args.calls, profile)
    dispatches = keys * args.calls
    rows: list[tuple[str, Any]] = [
        ("static (no tuning)", f"{static_s:.2f} s, {static_s / keys * 1e3:.2f} ms/key "
         f"(CPU {static_cpu:.2f} s) {check(static_arb, names, dispatches, 0)}"),
        ("tune", f"{tune_s:.2f} s, {tune_s / keys * 1e3:.2f} ms/key "
         f"(CPU {tune_cpu:.2f} s) {check(tune_arb, names, dispatches, keys)}"),
    ]
    ratio = tune_s / static_s
    added = (tune_s - static_s) / keys
    timed, spent = kernel_time(tune_arb)
    rows += [
        ("tune / static", f"{ratio:.2f}x wall, {tune_cpu / static_cpu:.2f}x CPU (target <= "
         f"{RATIO_TARGET}x: {'met' if ratio <= RATIO_TARGET else 'NOT met'})"),
        ("added per key", f"{added * 1e3:.2f} ms, {added / args.candidates * 1e3:.3f} ms "
         "per key and candidate"),
        ("comparisons", f"{spent:.2f} s wall ({spent / tune_s:.0%} of the tune), of which "
         f"the kernels' timed calls {timed:.2f} s ({timed / tune_s:.0%} of the tune)"),
    ]
    width = max(len(r[0]) for r in rows)
    for label, text in rows:
        print(f"{label:<{width}}  {text}")
    print(f"load average {load_average()}")
    if profile is not None:
        print_profile(profile, args.profile, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
