"""The hot path at five scales (issue 26, point 1): what a cache-hit dispatch adds over
calling the winner directly, side by side with the dict floor, at 1, 100, 10k, 100k and
1M distinct input shapes.

The measurement is bench/hot_path.py's sweep (its ops, its dict floor, its interleaved
rounds; the dispatch measured is ``pytest_arbiter.dispatch``), with what the issue's
target reads: the dispatch's added cost over the floor's added cost, at most 1.5x at
every scale. A working set larger than the arbiter's plan table is cycled through
whole in every round (each round calls every shape once), so a dispatcher that
re-plans past its bound shows it here; the warm pass (the first call of each shape:
planning) is shown beside it.

Run: ``python bench/hot_path_scale.py`` (about 4 minutes; 1M shapes take ~1 GB),
``--sizes 1,100,10000`` for a part, ``--before DIR`` for an older tree first::

    git archive 41364dd | tar -x -C /tmp/before
    python bench/hot_path_scale.py --rounds 5 --before /tmp/before
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hot_path import (
    SWEEP_OP,
    Paths,
    _floor_of,
    _only_won,
    _setup,
    _side_by_side,
    head_add_one_kernel,
)
from trees import BEFORE_HELP, header, run_before

SIZES = (1, 100, 10_000, 100_000, 1_000_000)
RATIO_TARGET = 1.5
"""What a dispatch may add, at most, in multiples of what the dict floor adds."""


def scale_row(n: int, rounds: int, per_block: int) -> str:
    """One scale: ``n`` float32 views of lengths 8..8+n-1 of one buffer, planned in one
    warm pass, then timed: direct call, dict floor, ``pytest_arbiter.dispatch``."""
    paths, counts = _setup_once()
    label, dispatch = next(iter(paths.items()))
    base = np.arange(8 + n, dtype=np.float32)
    xs = [base[:8 + i] for i in range(n)]
    start = time.perf_counter()
    for x in xs:
        dispatch(SWEEP_OP, x)
    warm_us = (time.perf_counter() - start) / n * 1e6
    floor = _floor_of({(SWEEP_OP, None, x.__class__, x.shape, x.dtype, x.strides):
                       head_add_one_kernel for x in xs})
    calls = [(SWEEP_OP, x) for x in xs]
    medians, added = _side_by_side([(head_add_one_kernel, [(x,) for x in xs]),
                                    (floor, calls), (dispatch, calls)], rounds, per_block)
    by_floor, by_path = added[1], added[2]
    ratio = by_path / by_floor if by_floor > 0 else float("inf")
    fast = _only_won(counts, SWEEP_OP, "bench_head_add_one_numpy")
    met = "yes" if fast and ratio <= RATIO_TARGET else "NO"
    return (f"{n:>9,}  {medians[0]:7.0f}  {by_floor:+7.0f}  {by_path:+9.0f}  "
            f"{ratio:6.2f}x  {met:>4}  {warm_us:8.1f}  {label}"
            f"{'' if fast else '  NOT all won by the candidate: not the fast path'}")


@functools.cache
def _setup_once() -> tuple[Paths, Callable[..., dict[Any, int]]]:
    """hot_path's setup, once per process (it registers the bench's ops)."""
    return _setup()


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), metavar="LIST",
                        help="numbers of distinct shapes (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per scale")
    parser.add_argument("--per-block", type=int, default=20_000,
                        help="calls per timed block (at least one pass over the shapes)")
    parser.add_argument("--before", metavar="DIR", help=BEFORE_HELP)
    args = parser.parse_args(args_in)
    if args.before:
        run_before(args.before, __file__, args_in)
    print(header())
    print(f"ns per call, median over {args.rounds} rounds; added = minus the direct call "
          f"in the same round; target: dispatch added <= {RATIO_TARGET}x the floor's")
    print(f"{'shapes':>9}  {'direct':>7}  {'floor+':>7}  {'dispatch+':>9}  {'ratio':>7}  "
          f"{'met':>4}  {'warm us':>8}  path")
    for n in (int(s) for s in args.sizes.split(",") if s.strip()):
        print(scale_row(n, args.rounds, args.per_block), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
