"""False alarms and catches of the re-check, on real CPU kernels under the machine's noise.

Run: python bench/bench_recheck.py [--keys 200] [--trials 20] [--budget-ms 10]
     [--huge-keys 20] [--slow-keys 20] [--family 1] [--alpha 0.001] [--json PATH]

Builds a corpus of ``--keys`` keys, each a cached winner and its runner-up: the same
real kernel (``np.sin`` over a slice, or a small matmul whose inner dimension is the
work), the runner-up doing ``gap`` more work, the gaps from 0% to 20% (spaced
quadratically, so a quarter of the keys are within 1.2%; the first few are identical
work). One key in five has a winner that is slower than its runner-up by 0% to 0.95%
(the tie rule keeps the higher tier within the margin): still below the margin, so a
flag there is a false alarm too, and the hardest case for the test. A second corpus
makes every winner slower than its runner-up by 10% to 20%: stale. Every key of both
corpora is calibrated at length (hundreds of paired rounds) and classed by the
calibrated ratio, not the designed one. A third corpus of ``--huge-keys`` keys has a
winner made 45x slower (its kernel run 45 times a call), the kernels' calls from about
20 us to 1 ms before the slowdown (so the winner's from 1 to 45 ms: most are past the
key budget in one round); its gap needs no calibration. A fourth, of ``--slow-keys``
keys, is the unchanged corpus's hardest case on slow pairs: winners 0% to 0.95% slower
than their runner-up, calls of about 1 to 4 ms (the rounds go past the key budget for
these too), calibrated on fewer rounds (``--slow-calibration-rounds``); a flag there is
a false alarm, counted in (a) apart.
Then all are re-checked ``--trials`` times, in a fresh random key order each trial.

Prints (a) the share of re-checks flagging a key whose calibrated gap is below the
margin, (b) the share of truly stale re-checks (calibrated winner slower by 10%+)
caught, (c) the wall time per key, with the load average before and after, and (d) the
45x keys caught, the trials in which every one of them was, and their time per key.
"""

from __future__ import annotations

import os

# one BLAS thread: the kernels are small, and threads would only add the pool's noise
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from pytest_arbiter.timing.measure import ComparePolicy, compare_latencies
from pytest_arbiter.timing.recheck import RecheckPolicy, recheck

RNG = np.random.default_rng(0)
SIN_X = RNG.uniform(0.5, 1.5, 50_000)
MM_A = RNG.standard_normal((48, 4096))
MM_B = RNG.standard_normal((4096, 48))


def sin_kernel(n: int) -> Callable[[], object]:
    """``np.sin`` over ``n`` elements: compute-bound, cost linear in ``n``."""
    xs = SIN_X[:n].copy()
    out = np.empty(n)
    return lambda: np.sin(xs, out=out)


def matmul_kernel(k: int) -> Callable[[], object]:
    """A 48 x ``k`` by ``k`` x 48 matmul: cost linear in the inner dimension."""
    a = np.ascontiguousarray(MM_A[:, :k])
    b = np.ascontiguousarray(MM_B[:k, :])
    out = np.empty((48, 48))
    return lambda: np.matmul(a, b, out=out)


@dataclass
class Key:
    name: str
    kind: str
    designed: float  # winner's work over the runner-up's, minus one
    winner: Callable[[], object]
    other: Callable[[], object]
    true_ratio: float = 1.0  # calibrated: winner's time over the runner-up's


def repeated(kernel: Callable[[], object], times: int) -> Callable[[], object]:
    """``kernel`` run ``times`` times a call: the same code, ``times`` times slower."""
    def run() -> None:
        for _ in range(times):
            kernel()

    return run


def make_key(i: int, kind: str, winner_work: float, other_work: float, designed: float) -> Key:
    make = sin_kernel if kind == "sin" else matmul_kernel
    return Key(f"{kind}-{i}", kind, designed, make(round(winner_work)), make(round(other_work)))


def base_work(i: int, kind: str) -> float:
    # calls of roughly 20 to 60 us, varied across keys
    spread = 1.0 + 2.0 * ((i * 37) % 100) / 100
    return 2500 * spread if kind == "sin" else 200 * spread


def corpora(keys: int) -> tuple[list[Key], list[Key]]:
    unchanged, stale = [], []
    for i in range(keys):
        kind = "sin" if i % 2 == 0 else "matmul"
        base = base_work(i, kind)
        if i % 10 in (4, 9):
            # a tie kept for the higher tier: the winner slower by less than the margin
            slower = 0.0095 * ((i // 10) % 10) / 9
            unchanged.append(make_key(i, kind, base * (1 + slower), base, slower))
        else:
            gap = 0.20 * (i / max(1, keys - 1)) ** 2
            unchanged.append(make_key(i, kind, base, base * (1 + gap), -gap))
        slow = 0.10 + 0.10 * ((i * 53) % 100) / 99
        stale.append(make_key(i, kind, base * (1 + slow), base, slow))
    return unchanged, stale


def huge_corpus(keys: int, slowdown: int = 45) -> list[Key]:
    """Winners made ``slowdown`` times slower: base calls from about 20 us to 1 ms,
    spaced geometrically (a sin over 2,500 to 50,000 elements, a matmul with an inner
    dimension of 200 to 4,000)."""
    found = []
    for i in range(keys):
        kind = "sin" if i % 2 == 0 else "matmul"
        scale = 20.0 ** (i / max(1, keys - 1))
        work = 2500 * scale if kind == "sin" else 200 * scale
        make = sin_kernel if kind == "sin" else matmul_kernel
        found.append(Key(f"{kind}-{i}x{slowdown}", kind, slowdown - 1.0,
                         repeated(make(round(work)), slowdown), make(round(work)),
                         float(slowdown)))
    return found


def slow_ties(keys: int) -> list[Key]:
    """Slow pairs within the margin: the winner 0% to 0.95% slower, calls of about 1 to 4
    ms (a sin over 25,000 to 50,000 elements or a matmul with an inner dimension of
    2,000 to 4,000, run twice a call)."""
    found = []
    for i in range(keys):
        kind = "sin" if i % 2 == 0 else "matmul"
        base = (25_000 if kind == "sin" else 2000) * (1 + ((i * 37) % 100) / 100)
        slower = 0.0095 * (i % 10) / 9
        make = sin_kernel if kind == "sin" else matmul_kernel
        found.append(Key(f"slow-{kind}-{i}", kind, slower,
                         repeated(make(round(min(base * (1 + slower), 50_000 if kind == "sin"
                                                 else 4096))), 2),
                         repeated(make(round(base)), 2)))
    return found


def calibrate(key: Key, rounds: int) -> float:
    """The winner's median paired ratio to the runner-up over ``rounds`` rounds."""
    ratios: list[float] = []

    def keep(times: Mapping[str, float]) -> bool:
        ratios.append(times["w"] / times["o"])
        return len(ratios) >= rounds

    compare_latencies({"w": key.winner, "o": key.other}, on_round=keep,
                      policy=ComparePolicy(warmup=5, min_rounds=1, max_rounds=rounds,
                                           budget_s=60.0, alpha=0.0, seed=None))
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--budget-ms", type=float, default=10.0)
    parser.add_argument("--huge-keys", type=int, default=20,
                        help="keys whose winner was made 45x slower (0: none)")
    parser.add_argument("--family", type=int, default=1,
                        help="Bonferroni family size (1: per-key alpha)")
    parser.add_argument("--alpha", type=float, default=RecheckPolicy.alpha,
                        help="the sign test's level (a loose one checks the bound holds)")
    parser.add_argument("--slow-keys", type=int, default=20,
                        help="slow pairs within the margin, calls of 1-4 ms (0: none)")
    parser.add_argument("--calibration-rounds", type=int, default=600)
    parser.add_argument("--slow-calibration-rounds", type=int, default=100)
    parser.add_argument("--json", default=None, help="write the raw figures here")
    args = parser.parse_args(argv)

    load_before = os.getloadavg()
    policy = RecheckPolicy(key_budget_s=args.budget_ms / 1000, family=args.family,
                           alpha=args.alpha)
    margin = policy.margin
    unchanged, stale = corpora(args.keys)
    huge = huge_corpus(args.huge_keys)
    slow = slow_ties(args.slow_keys)
    started = time.perf_counter()
    for key in unchanged + stale:
        key.true_ratio = calibrate(key, args.calibration_rounds)
    for key in slow:
        key.true_ratio = calibrate(key, args.slow_calibration_rounds)
    calibrated_s = time.perf_counter() - started
    below = [k for k in unchanged if k.true_ratio <= 1 + margin]
    truly_stale = [k for k in stale if k.true_ratio >= 1.10]
    slow_below = [k for k in slow if k.true_ratio <= 1 + margin]

    flags: dict[str, int] = {}
    spent: list[int] = []
    timed: list[int] = []
    rounds: list[int] = []
    huge_spent: list[int] = []
    huge_rounds: list[int] = []
    huge_every = 0
    slow_spent: list[int] = []
    undecided = {"unchanged": 0, "stale": 0, "huge": 0, "slow": 0}
    shuffle = random.Random(1)
    corpus_of = {id(k): c for c, keys in (("unchanged", unchanged), ("stale", stale),
                                          ("huge", huge), ("slow", slow)) for k in keys}
    for _ in range(args.trials):
        order = unchanged + stale + huge + slow
        shuffle.shuffle(order)
        huge_found = 0
        for key in order:
            result = recheck("w", {"w": key.winner, "o": key.other}, policy=policy)
            corpus = corpus_of[id(key)]
            if corpus == "huge":
                huge_spent.append(result.spent_ns)
                huge_rounds.append(result.rounds)
                huge_found += result.stale
            elif corpus == "slow":
                slow_spent.append(result.spent_ns)
            else:
                spent.append(result.spent_ns)
                timed.append(result.timed_ns)
                rounds.append(result.rounds)
            undecided[corpus] += result.rounds < policy.min_rounds
            tag = f"{corpus}/{key.name}"
            flags[tag] = flags.get(tag, 0) + result.stale
        huge_every += huge_found == len(huge)
    load_after = os.getloadavg()

    false_alarms = sum(flags[f"unchanged/{k.name}"] for k in below)
    caught = sum(flags[f"stale/{k.name}"] for k in truly_stale)
    n_below = len(below) * args.trials
    n_stale = len(truly_stale) * args.trials
    spent_ms = sorted(s / 1e6 for s in spent)
    p99 = spent_ms[min(len(spent_ms) - 1, int(0.99 * len(spent_ms)))]
    unchanged_above = [k for k in unchanged if k.true_ratio > 1 + margin]
    stale_missed = [(k.name, round(k.true_ratio, 4), args.trials - flags[f"stale/{k.name}"])
                    for k in truly_stale if flags[f"stale/{k.name}"] < args.trials]
    alarm_keys = [(k.name, round(k.true_ratio, 4), flags[f"unchanged/{k.name}"])
                  for k in below if flags[f"unchanged/{k.name}"]]

    print(f"command: python bench/bench_recheck.py --keys {args.keys} --trials {args.trials} "
          f"--budget-ms {args.budget_ms:g} --family {args.family} --alpha {args.alpha:g}")
    print(f"policy: {policy}")
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f}; after: {load_after[0]:.2f} {load_after[1]:.2f} "
          f"{load_after[2]:.2f}; cpus: {os.cpu_count()}")
    print(f"calibration: {args.calibration_rounds} paired rounds per key, "
          f"{calibrated_s:.1f} s for {2 * args.keys} keys")
    print(f"unchanged corpus: {len(below)} keys calibrated within the margin "
          f"(ratio <= {1 + margin:g}), {len(unchanged_above)} above it (excluded: "
          f"{[(k.name, round(k.true_ratio, 4)) for k in unchanged_above]})")
    print(f"(a) false alarms: {false_alarms} of {n_below} re-checks "
          f"= {100 * false_alarms / max(1, n_below):.3f}%  (target < 0.5%)"
          f"{'  keys: ' + str(alarm_keys) if alarm_keys else ''}")
    print(f"(b) caught: {caught} of {n_stale} re-checks of {len(truly_stale)} truly stale "
          f"keys = {100 * caught / max(1, n_stale):.2f}%  (target > 95%)"
          f"{'  missed: ' + str(stale_missed[:20]) if stale_missed else ''}")
    print(f"(c) wall time per key: mean {statistics.fmean(spent_ms):.2f} ms, median "
          f"{statistics.median(spent_ms):.2f}, p99 {p99:.2f}, max {spent_ms[-1]:.2f} ms; "
          f"timed calls mean {statistics.fmean(timed) / 1e6:.2f} ms; rounds median "
          f"{statistics.median(rounds):g}  (target < 10 ms)")
    print(f"too few rounds for a verdict: {undecided['unchanged']} unchanged and "
          f"{undecided['stale']} stale re-checks of {args.trials * args.keys} each")
    if slow:
        slow_alarms = sum(flags[f"slow/{k.name}"] for k in slow_below)
        slow_ms = sorted(s / 1e6 for s in slow_spent)
        print(f"(a, slow pairs) false alarms: {slow_alarms} of {len(slow_below) * args.trials} "
              f"re-checks of {len(slow_below)} slow keys within the margin (calibrated on "
              f"{args.slow_calibration_rounds} rounds; above it, excluded: "
              f"{[(k.name, round(k.true_ratio, 4)) for k in slow if k not in slow_below]}); "
              f"no verdict {undecided['slow']}; wall ms per key: median "
              f"{statistics.median(slow_ms):.1f}, max {slow_ms[-1]:.1f}")
    if huge:
        huge_ms = sorted(s / 1e6 for s in huge_spent)
        caught_huge = sum(flags[f"huge/{k.name}"] for k in huge)
        missed_huge = [(k.name, args.trials - flags[f"huge/{k.name}"]) for k in huge
                       if flags[f"huge/{k.name}"] < args.trials]
        print(f"(d) 45x slower: caught {caught_huge} of {len(huge) * args.trials} re-checks "
              f"of {len(huge)} keys; every key caught in {huge_every} of {args.trials} "
              f"trials; no verdict {undecided['huge']}"
              f"{'  missed: ' + str(missed_huge) if missed_huge else ''}")
        print(f"    wall time per key: mean {statistics.fmean(huge_ms):.1f} ms, median "
              f"{statistics.median(huge_ms):.1f}, p99 "
              f"{huge_ms[min(len(huge_ms) - 1, int(0.99 * len(huge_ms)))]:.1f}, max "
              f"{huge_ms[-1]:.1f} ms; rounds median {statistics.median(huge_rounds):g}, "
              f"min {min(huge_rounds)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"args": vars(args), "load_before": load_before, "load_after": load_after,
                       "false_alarms": false_alarms, "below_rechecks": n_below,
                       "caught": caught, "stale_rechecks": n_stale, "spent_ms": spent_ms,
                       "keys": {k.name: {"designed": k.designed, "true_ratio": k.true_ratio,
                                         "flags": flags[f"unchanged/{k.name}"]}
                                for k in unchanged},
                       "stale_keys": {k.name: {"designed": k.designed,
                                               "true_ratio": k.true_ratio,
                                               "flags": flags[f"stale/{k.name}"]}
                                      for k in stale},
                       "slow_keys": {k.name: {"designed": k.designed,
                                              "true_ratio": k.true_ratio,
                                              "flags": flags[f"slow/{k.name}"]}
                                     for k in slow},
                       "huge_keys": {k.name: {"flags": flags[f"huge/{k.name}"]} for k in huge},
                       "huge_spent_ms": sorted(s / 1e6 for s in huge_spent),
                       "huge_every_key_trials": huge_every}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
