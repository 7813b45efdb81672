"""Do two xdist workers pick the winners one worker picks, with and without the lock?

Run: python bench/bench_contention.py [--keys 40] [--repeat 3] [--size 6000]
     [--gap-min 0.03 --gap-max 0.08]

Writes a throwaway pytest project with ``--keys`` user ops, each with two real CPU
candidates that compute ``np.sin(x)`` over ``--size`` elements, one of them doing 3% to
8% more work (``np.sin`` over that share of ``x`` again, into a scratch buffer): a
near tie. Which of the pair is the lean one is shuffled, and their names say nothing.
Then it runs ``pytest --arbiter-tune`` on it ``--repeat`` times each way: ``-n 0``
(twice, for the baseline's own agreement), ``-n 2`` with the per-device measurement
lock, and ``-n 2`` without it (each worker gets its own lock folder, so neither waits).
Prints, per run, how many of the keys' winners agree with the first ``-n 0`` run and
with the truth (the lean candidate), how many picks were not ties and how many were
significant (the entry's p-value below ``ComparePolicy().alpha``), and how many of each
are wrong, how many entries say ``timed_alone``, and the load average before and after
each run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_arbiter.store.cache_file import decode_document
from pytest_arbiter.timing.measure import ComparePolicy

REPO = Path(__file__).resolve().parent.parent

CONFTEST = '''
import json
import os

import numpy as np

import pytest_arbiter

if os.environ.get("BENCH_NO_LOCK") and os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["PYTEST_ARBITER_LOCK_DIR"] = os.path.join(
        os.environ["BENCH_LOCK_BASE"], os.environ["PYTEST_XDIST_WORKER"])

SPEC = json.loads(open(os.path.join(os.path.dirname(__file__), "spec.json")).read())


def make(extra):
    scratch = np.empty(max(1, extra))

    def run(x):
        out = np.sin(x)
        if extra:
            np.sin(x[:extra], out=scratch)
        return out

    return run


for key in SPEC["keys"]:
    pytest_arbiter.op(key["op"], reference=np.sin)
    for name, extra in key["candidates"]:
        pytest_arbiter.candidate(key["op"], target="cpu", name=name)(make(extra))
'''

TESTS = '''
import json
import os

import numpy as np
import pytest

SPEC = json.loads(open(os.path.join(os.path.dirname(__file__), "spec.json")).read())
X = np.random.default_rng(0).uniform(0.5, 1.5, SPEC["size"])


@pytest.mark.parametrize("op", [k["op"] for k in SPEC["keys"]])
def test_key(arbiter, op):
    arbiter.dispatch(op, X)
'''


def write_project(folder: Path, keys: int, size: int, gaps: tuple[float, float]
                  ) -> dict[str, str]:
    """The project's files; returns each op's lean (truly faster) candidate."""
    rng = random.Random(7)
    spec_keys, truth = [], {}
    for i in range(keys):
        op = f"cont{i:02d}"
        gap = gaps[0] + (gaps[1] - gaps[0]) * i / max(1, keys - 1)
        lean, heavy = (f"{op}_a", f"{op}_b") if rng.random() < 0.5 else (f"{op}_b", f"{op}_a")
        pair = [[lean, 0], [heavy, round(size * gap)]]
        rng.shuffle(pair)
        spec_keys.append({"op": op, "gap": gap, "candidates": pair})
        truth[op] = lean
    (folder / "spec.json").write_text(json.dumps({"size": size, "keys": spec_keys}))
    (folder / "conftest.py").write_text(CONFTEST)
    (folder / "test_contention.py").write_text(TESTS)
    return truth


def tune(folder: Path, label: str, workers: int, lock: bool, run: int) -> dict[str, object]:
    cache = folder / f"cache-{label}-{run}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get(
        "PYTHONPATH", "")]), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
        "BENCH_LOCK_BASE": str(folder / f"locks-{label}-{run}"),
        "PYTEST_ARBITER_LOCK_DIR": str(folder / "locks-shared")}
    if not lock:
        env["BENCH_NO_LOCK"] = "1"
    load = os.getloadavg()
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--arbiter-tune", f"--arbiter-cache={cache}", "-n", str(workers)],
                          cwd=folder, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if proc.returncode != 0 or not cache.exists():
        sys.exit(f"{label}: pytest exited {proc.returncode}\n{proc.stdout[-3000:]}"
                 f"{proc.stderr[-3000:]}")
    entries = decode_document(cache.read_bytes(), source=str(cache))
    return {"winners": {e.op: e.ranking[0].name for e in entries},
            "not_tie": {e.op for e in entries if not e.tie},
            "significant": {e.op for e in entries
                            if (e.provenance.p_value or 1.0) < ComparePolicy().alpha},
            "alone": sum(1 for e in entries if e.provenance.timed_alone is True),
            "load": load, "load_after": os.getloadavg(), "seconds": took}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--size", type=int, default=6000)
    parser.add_argument("--gap-min", type=float, default=0.03)
    parser.add_argument("--gap-max", type=float, default=0.08)
    args = parser.parse_args(argv)
    plan = [("n0", 0, True), ("n0-again", 0, True), ("n2-lock", 2, True),
            ("n2-nolock", 2, False)]
    with tempfile.TemporaryDirectory(prefix="arbiter-contention-") as tmp:
        folder = Path(tmp)
        truth = write_project(folder, args.keys, args.size, (args.gap_min, args.gap_max))
        print(f"command: python bench/bench_contention.py --keys {args.keys} "
              f"--repeat {args.repeat} --size {args.size} --gap-min {args.gap_min:g} "
              f"--gap-max {args.gap_max:g}; cpus: {os.cpu_count()}")
        totals: dict[str, list[int]] = {label: [0] * 7 for label, _, _ in plan}
        for run in range(args.repeat):
            results = {label: tune(folder, label, workers, lock, run)
                       for label, workers, lock in plan}
            base = results["n0"]["winners"]
            assert isinstance(base, dict)
            for label, _, _ in plan:
                res = results[label]
                winners = res["winners"]
                assert isinstance(winners, dict)
                same = sum(1 for op, w in winners.items() if base.get(op) == w)
                right = sum(1 for op, w in winners.items() if truth[op] == w)
                not_tie, significant = res["not_tie"], res["significant"]
                assert isinstance(not_tie, set) and isinstance(significant, set)
                not_tie_wrong = sum(1 for op in not_tie if truth[op] != winners[op])
                sure_wrong = sum(1 for op in significant if truth[op] != winners[op])
                totals[label][0] += same
                totals[label][1] += right
                totals[label][2] += len(winners)
                totals[label][3] += len(not_tie)
                totals[label][4] += not_tie_wrong
                totals[label][5] += len(significant)
                totals[label][6] += sure_wrong
                load, after = res["load"], res["load_after"]
                assert isinstance(load, tuple) and isinstance(after, tuple)
                print(f"run {run} {label:10s}: {same:2d}/{len(winners)} agree with n0, "
                      f"{right:2d}/{len(winners)} lean, {len(not_tie):2d} not ties "
                      f"({not_tie_wrong} wrong), {len(significant):2d} significant "
                      f"({sure_wrong} wrong), timed_alone {res['alone']:2d}, "
                      f"{res['seconds']:.1f} s, load {load[0]:.2f} -> {after[0]:.2f}")
        for label, (same, right, total, nt, nt_wrong, sig, sig_wrong) in totals.items():
            print(f"total {label:10s}: {same}/{total} agree with n0, {right}/{total} lean; "
                  f"{nt} not ties ({nt_wrong} wrong), {sig} significant at the "
                  f"comparison's alpha ({sig_wrong} wrong)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
