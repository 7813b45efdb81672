"""The dispatch hot path: what a cache-hit dispatch adds over calling the winner directly.

Four ways to run the same kernel on the same inputs, side by side in one process:

* ``direct``: the winning kernel called directly;
* ``dict floor``: a hand-written dispatcher, ``floor(op, *inputs, target=None)``, that
  looks the kernel up in a dict keyed like the arbiter's signature (op, target, and each
  input's class, shape, dtype and strides: a kernel's layout is part of what was gated),
  then calls it;
* ``pytest_arbiter.dispatch``: the public call a kernel library makes, through the
  process arbiter;
* ``Arbiter.dispatch``: the same arbiter's method, called directly.

The user ops are registered with the public API (``pytest_arbiter.op`` and
``pytest_arbiter.candidate``), and the process arbiter is configured as in production
(``pytest_arbiter.configure(cache=None, mode="static", gate=False)``). Each round times
one block of calls per variant, the order rotating from round to round; a variant's
added cost is the median over rounds of its per-call time minus the direct call's in
the same round. The garbage collector stays on, as in a user's process. After timing,
every dispatch of the bench's ops must be counted ``won`` for its candidate: otherwise
the rows did not measure the fast path, and they say so.

Run alone: ``python bench/hot_path.py`` (``--help`` for the options). Before and after
the dispatch rewrite, with the older tree extracted to a folder (it has no
``pytest_arbiter.dispatch``, so only ``Arbiter.dispatch`` is measured there)::

    git archive a9cd687 | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before python bench/hot_path.py --sizes 100,10000 --rounds 7
    python bench/hot_path.py --sizes 100,10000 --rounds 7
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import pytest_arbiter

Row = tuple[str, str, str, bool | None]
"""(figure, measured, target, met); ``None``: a reference figure with no target."""

TARGET_NS = 600.0
"""The issue's target: what a cache-hit dispatch of a trivial user op adds, at most."""
FLAT_NS = 100.0
"""How much what a dispatch adds over the dict floor may grow from 1 to 100k shapes."""
TRIVIAL_OP = "bench_add_one"
SWEEP_OP = "bench_head_add_one"
SWEEP_SIZES = (1, 100, 10_000, 100_000)


def add_one(x: np.ndarray) -> np.ndarray:
    """The trivial user op: x + 1 (reference and kernel alike)."""
    return x + 1


def head_add_one(x: np.ndarray) -> np.ndarray:
    """x + 1 on the first 8 elements: the same work whatever the input's length, so the
    sweep's kernel costs the same at every number of shapes."""
    return x[:8] + 1


def add_one_kernel(x: np.ndarray) -> np.ndarray:
    return x + 1


def head_add_one_kernel(x: np.ndarray) -> np.ndarray:
    return x[:8] + 1


Paths = dict[str, Callable[..., Any]]
"""The dispatch paths measured, by the label their rows carry."""


def _setup() -> tuple[Paths, Callable[..., dict[Any, int]]]:
    """Register the bench's ops and candidates, configure the process arbiter, and return
    the paths to measure and the arbiter's histogram counts.

    On a tree without ``pytest_arbiter.configure`` (the code before the dispatch rewrite,
    for a before/after run) only ``Arbiter.dispatch`` is measured, on a ``static``
    arbiter of its own.
    """
    pytest_arbiter.op(TRIVIAL_OP, reference=add_one)
    pytest_arbiter.op(SWEEP_OP, reference=head_add_one)
    pytest_arbiter.candidate(TRIVIAL_OP, target="cpu", name="bench_add_one_numpy")(
        add_one_kernel)
    pytest_arbiter.candidate(SWEEP_OP, target="cpu", name="bench_head_add_one_numpy")(
        head_add_one_kernel)
    configure = getattr(pytest_arbiter, "configure", None)
    if configure is None:
        arb = pytest_arbiter.Arbiter(mode="static")
        return {"Arbiter.dispatch": arb.dispatch}, arb.histogram.counts
    arb = configure(cache=None, mode="static", gate=False)
    return ({"pytest_arbiter.dispatch": pytest_arbiter.dispatch,
             "Arbiter.dispatch": arb.dispatch}, arb.histogram.counts)


def _floor_of(table: dict[Any, Callable[..., Any]]) -> Callable[..., Any]:
    """A hand-written dispatcher over ``table``: the lookup floor the arbiter is held to."""

    def floor(op: str, *inputs: Any, target: str | None = None) -> Any:
        x = inputs[0]
        return table[(op, target, x.__class__, x.shape, x.dtype, x.strides)](*inputs)

    return floor


Variant = tuple[Callable[..., Any], list[tuple[Any, ...]]]


def _block(fn: Callable[..., Any], calls: list[tuple[Any, ...]], repeat: int
           ) -> Callable[[], float]:
    """One timed block: ``repeat`` passes of ``fn(*args)`` over ``calls``; ns per call."""
    clock = time.perf_counter_ns
    count = repeat * len(calls)

    def run() -> float:
        start = clock()
        for _ in range(repeat):
            for args in calls:
                fn(*args)
        return (clock() - start) / count

    return run


def _side_by_side(variants: Sequence[Variant], rounds: int, per_block: int
                  ) -> tuple[list[float], list[float]]:
    """Per variant: the median per-call time, and the median paired difference to the
    first variant (the direct call), over ``rounds`` interleaved rounds."""
    repeat = max(1, per_block // len(variants[0][1]))
    blocks = [_block(fn, calls, repeat) for fn, calls in variants]
    samples: list[list[float]] = [[] for _ in blocks]
    for block in blocks:  # one untimed pass each: caches and branch predictors warm
        block()
    k = len(blocks)
    for r in range(rounds):
        for j in range(k):
            i = (r + j) % k
            samples[i].append(blocks[i]())
    medians = [statistics.median(s) for s in samples]
    added = [statistics.median(v - d for v, d in zip(s, samples[0], strict=True))
             for s in samples]
    return medians, added


def _only_won(counts: Callable[..., dict[Any, int]], op: str, candidate: str) -> bool:
    found = counts(op=op)
    return bool(found) and all(k[2] == candidate and k[3] == "won" for k in found)


def _ok(added: float, fast_path: bool) -> bool:
    return fast_path and added <= TARGET_NS


NOT_FAST = "; NOT all won by the candidate: not the fast path"


def trivial(paths: Paths, counts: Callable[..., dict[Any, int]], rounds: int,
            per_block: int) -> list[Row]:
    """``x + 1`` on 8 float32: the direct call, the dict floor and each path side by side."""
    x = np.arange(8, dtype=np.float32)
    next(iter(paths.values()))(TRIVIAL_OP, x)  # plans the signature
    floor = _floor_of({(TRIVIAL_OP, None, x.__class__, x.shape, x.dtype, x.strides):
                       add_one_kernel})
    calls = [(TRIVIAL_OP, x)]
    medians, added = _side_by_side(
        [(add_one_kernel, [(x,)]), (floor, calls), *[(fn, calls) for fn in paths.values()]],
        rounds, per_block)
    direct, by_floor = medians[0], added[1]
    note = "" if _only_won(counts, TRIVIAL_OP, "bench_add_one_numpy") else NOT_FAST
    what = "x+1, 8 f32"
    rows: list[Row] = [(f"hot path: dict floor - direct ({what})", f"{by_floor:+.0f} ns "
                        f"(direct {direct:.0f} ns){note}", "reference", None)]
    for path, by_path in zip(paths, added[2:], strict=True):
        rows.append((f"hot path: {path} - direct ({what})", f"{by_path:+.0f} ns "
                     f"({by_path - by_floor:+.0f} ns over the floor){note}",
                     f"<= {TARGET_NS:.0f} ns", _ok(by_path, not note)))
    return rows


def sweep(paths: Paths, counts: Callable[..., dict[Any, int]], sizes: Sequence[int],
          rounds: int, per_block: int) -> list[Row]:
    """Cycling through ``n`` distinct input shapes (float32 views of lengths 8..8+n-1 of
    one buffer, pre-built), after one warm pass that plans every signature.

    Then, per path, whether the cost stays flat from the first size to the last: what
    the dispatch adds over the dict floor may grow by at most ``FLAT_NS`` (the floor's
    own growth is the memory cost of a table that large, which any dispatcher pays).
    """
    warm = next(iter(paths.values()))
    base = np.arange(8 + max(sizes), dtype=np.float32)
    rows: list[Row] = []
    over: dict[str, list[tuple[int, float, bool]]] = {path: [] for path in paths}
    for n in sizes:
        xs = [base[:8 + i] for i in range(n)]
        start = time.perf_counter()
        for x in xs:  # the warm pass
            warm(SWEEP_OP, x)
        warm_us = (time.perf_counter() - start) / n * 1e6
        floor = _floor_of({(SWEEP_OP, None, x.__class__, x.shape, x.dtype, x.strides):
                           head_add_one_kernel for x in xs})
        calls = [(SWEEP_OP, x) for x in xs]
        medians, added = _side_by_side(
            [(head_add_one_kernel, [(x,) for x in xs]), (floor, calls),
             *[(fn, calls) for fn in paths.values()]], rounds, per_block)
        direct, by_floor = medians[0], added[1]
        fast = _only_won(counts, SWEEP_OP, "bench_head_add_one_numpy")
        shapes = f"{n:,} shape{'s' if n > 1 else ''}"
        context = (f"dict floor {by_floor:+.0f} ns, direct {direct:.0f} ns, warm pass "
                   f"{warm_us:.1f} us/call{'' if fast else NOT_FAST}")
        for path, by_path in zip(paths, added[2:], strict=True):
            rows.append((f"hot path, {shapes}: {path} - direct", f"{by_path:+.0f} ns "
                         f"({context})", f"<= {TARGET_NS:.0f} ns", _ok(by_path, fast)))
            over[path].append((n, by_path - by_floor, fast))
    if len(sizes) > 1:
        for path, seen in over.items():
            (first, at_first, _), (last, at_last, _) = seen[0], seen[-1]
            fast = all(f for _, _, f in seen)
            rows.append((f"hot path: flat from {first:,} to {last:,} shapes ({path})",
                         f"{at_last - at_first:+.0f} ns over the floor ({at_first:+.0f} ns at "
                         f"{first:,}, {at_last:+.0f} ns at {last:,})",
                         f"<= +{FLAT_NS:.0f} ns", fast and at_last - at_first <= FLAT_NS))
    return rows


def hot_path_rows(quick: bool) -> list[Row]:
    """Every hot-path row of the trivial user op: side by side, then the shape sweep."""
    paths, counts = _setup()
    rounds, per_block = (9, 10_000) if quick else (21, 20_000)
    return (trivial(paths, counts, rounds, per_block)
            + sweep(paths, counts, SWEEP_SIZES, rounds, per_block))


def main(argv: Sequence[str] | None = None) -> int:
    """The hot-path rows alone, or the sweep over other numbers of shapes (past
    ``MAX_PLANS`` too): ``python bench/hot_path.py --sizes 140000,300000 --rounds 3``."""
    import argparse
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--sizes", default=",".join(map(str, SWEEP_SIZES)), metavar="LIST",
                        help="numbers of distinct shapes to cycle through")
    parser.add_argument("--rounds", type=int, default=21, help="interleaved rounds")
    parser.add_argument("--sweep-only", action="store_true",
                        help="leave out the side-by-side rows of x+1 on 8 float32")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"{pytest_arbiter.__file__}; Python {sys.version.split()[0]}, NumPy "
          f"{np.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average {load}")
    paths, counts = _setup()
    rows = [] if args.sweep_only else trivial(paths, counts, args.rounds, 20_000)
    rows += sweep(paths, counts, sizes, args.rounds, 20_000)
    width = max(len(r[0]) for r in rows)
    for name, measured, target, ok in rows:
        met = "-" if ok is None else "yes" if ok else "NO"
        print(f"{name:<{width}}  {measured:<50}  {target:<16}  {met}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
