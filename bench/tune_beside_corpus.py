"""Tuning beside a big corpus (issue 26, point 5): ``pytest --arbiter-tune`` measuring 10
new keys with a 100k-entry corpus as its cache file, against the same tune with no
cache file, in fresh processes (wall and CPU time of the whole run, interleaved).

The project (a temporary folder): one user op with two candidates, one test per key
(1-D inputs of lengths 2, 4, ..., 2**keys: one bucket each). The corpus is made from a
real tune's file: the project tuned once into an empty file, then its entries copied
under another op and ``--entries`` distinct buckets (the document format of
docs/artifacts.md: the entries share the file's tables), and the copy written by
``pytest-arbiter merge``, in the writer's layout, as a shared corpus is. Three runs per
repeat:

* ``no cache``: ``--arbiter-tune --arbiter-cache=FILE``, FILE absent;
* ``corpus``: the same, FILE the corpus (it ends with the corpus and the new keys);
* ``corpus, read only``: plain ``pytest --arbiter-cache=FILE`` on the corpus plus the
  keys (no tuning, nothing written): what reading it costs.

Target (issue 26): the corpus tune at most 1.2x the tune with no cache. ``--profile
FILE`` runs one more corpus tune under cProfile and prints its top functions.
Run: ``python bench/tune_beside_corpus.py`` (about a minute), ``--before DIR`` for an
older tree first (bench/trees.py).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from trees import BEFORE_HELP, header, run_before

RATIO_TARGET = 1.2
CONFTEST = """
import pytest_arbiter

pytest_arbiter.op("bench_corpus_twice", reference=lambda x: x * 2)


@pytest_arbiter.candidate("bench_corpus_twice", target="cpu", name="bench_corpus_add", tier=1)
def add(x):
    return x + x


@pytest_arbiter.candidate("bench_corpus_twice", target="cpu", name="bench_corpus_mul")
def mul(x):
    return x * 2
"""
TESTS = """
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.parametrize("n", [2 ** i for i in range(1, {keys} + 1)])
def test_key(n):
    pytest_arbiter.dispatch("bench_corpus_twice", np.ones(n, np.float32))
"""


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pytest_run(project: Path, cache: Path, tune: bool, profile: Path | None = None
               ) -> tuple[float, float]:
    """One pytest run in a fresh process: its wall and CPU seconds."""
    runner = ["-m", "cProfile", "-o", str(profile)] if profile else []
    flags = ["--arbiter-tune"] if tune else []
    start, cpu = time.perf_counter(), children_cpu()
    done = subprocess.run([sys.executable, *runner, "-m", "pytest", "-q", "-p",
                           "no:cacheprovider", *flags, f"--arbiter-cache={cache}"],
                          cwd=project, env=os.environ, capture_output=True, text=True,
                          check=False)
    took = time.perf_counter() - start, children_cpu() - cpu
    if done.returncode != 0:
        raise SystemExit(f"pytest failed in {project}:\n{done.stdout[-3000:]}")
    return took


def entries_in(path: Path) -> int:
    return len(json.loads(path.read_bytes()).get("entries", [])) if path.exists() else 0


def make_corpus(seed_file: Path, out: Path, entries: int) -> None:
    """``entries`` copies of the seed file's entries, under another op and one bucket
    each, in the seed file's own document (its tables shared)."""
    document = json.loads(seed_file.read_bytes())
    seeds = document["entries"]
    copies = []
    for i in range(entries):
        entry = dict(seeds[i % len(seeds)])
        entry["op"] = "bench_corpus_other"
        entry["bucket"] = f"{i + 1}/a1/r1"
        copies.append(entry)
    document["entries"] = copies
    raw = out.with_name(f"raw-{out.name}")
    raw.write_text(json.dumps(document))
    # the corpus as the package writes it (what a fleet's merged corpus looks like)
    subprocess.run([sys.executable, "-m", "pytest_arbiter", "merge", "-o", str(out),
                    str(raw)], check=True, capture_output=True, env=os.environ)
    raw.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=10, help="new keys the tune measures")
    parser.add_argument("--entries", type=int, default=100_000, help="the corpus's size")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved repeats")
    parser.add_argument("--profile", metavar="FILE", help="cProfile one more corpus tune")
    parser.add_argument("--before", metavar="DIR", help=BEFORE_HELP)
    args = parser.parse_args(args_in)
    if args.before:
        run_before(args.before, __file__, args_in)
    print(header())
    with tempfile.TemporaryDirectory(prefix="tune-corpus-") as tmp:
        project = Path(tmp)
        (project / "conftest.py").write_text(CONFTEST)
        (project / "test_keys.py").write_text(TESTS.format(keys=args.keys))
        seed, corpus, cache = project / "seed.json", project / "corpus.json", project / "c.json"
        pytest_run(project, seed, tune=True)
        make_corpus(seed, corpus, args.entries)
        print(f"{args.keys} new keys; corpus {entries_in(corpus):,} entries, "
              f"{corpus.stat().st_size / 1e6:.1f} MB")
        runs: dict[str, list[tuple[float, float]]] = {}
        for _ in range(args.repeat):
            for label in ("no cache", "corpus", "corpus, read only"):
                cache.unlink(missing_ok=True)
                if label != "no cache":
                    shutil.copyfile(corpus, cache)
                read_only = label == "corpus, read only"
                if read_only:
                    pytest_run(project, cache, tune=True)  # the keys in, untimed
                runs.setdefault(label, []).append(pytest_run(project, cache, not read_only))
                expected = args.keys + (args.entries if label != "no cache" else 0)
                if entries_in(cache) != expected:
                    print(f"  {label}: {entries_in(cache):,} entries, NOT {expected:,}")
        for label, seen in runs.items():
            walls, cpus = [w for w, _ in seen], [c for _, c in seen]
            print(f"{label:<18}  wall {statistics.median(walls):6.2f} s "
                  f"({', '.join(f'{w:.2f}' for w in walls)}), CPU "
                  f"{statistics.median(cpus):6.2f} s ({', '.join(f'{c:.2f}' for c in cpus)})")
        for i, what in ((0, "wall"), (1, "CPU")):
            ratio = (statistics.median(r[i] for r in runs["corpus"])
                     / statistics.median(r[i] for r in runs["no cache"]))
            print(f"corpus / no cache, {what}: {ratio:.2f}x (target <= {RATIO_TARGET}x: "
                  f"{'met' if ratio <= RATIO_TARGET else 'NOT met'})")
        if args.profile:
            shutil.copyfile(corpus, cache)
            pytest_run(project, cache, tune=True, profile=Path(args.profile).resolve())
            stats = pstats.Stats(args.profile)
            stats.strip_dirs()
            for key in ("tottime", "cumulative"):
                print(f"\ncProfile of a corpus tune ({args.profile}), top 20 by {key}:")
                stats.sort_stats(key).print_stats(20)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
