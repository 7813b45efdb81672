"""The cache file, version 3 (msgspec structs) side by side with version 2 (the
hand-built format), in one run on the same entries.

Run: python bench/bench_store.py [--entries N] [--repeat R] [--scale M [--data DIR]]
                                 [--shards] [--tune N] [--skip-small]
     python bench/bench_store.py --make-corpus PATH [--entries N] [--seed S]
     python bench/bench_store.py --make-corpus N PATH [--seed S]
     python bench/bench_store.py --commands A B [--repeat R]
     python bench/bench_store.py --first-test PATH [--before DIR] [--repeat R]

``--make-corpus`` writes a realistic corpus of N entries (default 1,000,000) in the
current format: one to four ranked candidates each, with the tuner's provenance; the
keys of seed S start at (S - 1) * 3N/4, so seeds 1 and 2 share a quarter of their keys.
``--commands A B`` (two corpora, e.g. seeds 1 and 2) times each ``pytest-arbiter``
command (``show``, ``show --json``, ``diff A B``, ``merge -o OUT A B``, ``forget --op
softmax --dry-run``, ``gate`` of a histogram of as many entries against a baseline of as
many, ``report``) in a fresh process, as the console script runs it (``main(argv)``,
output to /dev/null), side by side with a raw scan of each file it reads
(``msgspec.json.decode(data, type=msgspec.Raw)`` after reading the file, in this
process): CPU seconds (and their system part), the ratio to the scans, peak RSS
(``VmHWM``), load average.
``--first-test PATH`` times a fresh ``pytest --arbiter-cache=PATH`` up to the start of
its first test (its own CPU time there) beside a raw scan of PATH, for this tree and
each ``--before DIR``.

The version 2 code is taken from git (``--v2 COMMIT``, the last commit before the
msgspec schema) into a temporary package, ``arbiter_v2``, so both run in one process.
Both get the same realistic entries (bench/bench_merge.py: one to four ranked
candidates, the tuner's provenance); version 3's also carry what version 2 cannot hold
(the candidates considered with their fingerprints, the environment, ``since``).

Measured, the median of R, interleaved, with the garbage collector on (as in a pytest
run; the version 2 reader pauses it itself):

- load: ``artifacts.read_cache`` (read, decode, validate every entry, build the dict);
- write: ``artifacts.write_cache`` (encode, lock, fsync, replace) of the cache just read,
  and of entries built in memory (as a tune's are; version 2 writes a read cache's rows
  through as they were read, so the two differ for it);
- what the collector tracks after a load, and one full collection with it loaded;
- merge: ``corpus.merge`` of two loaded shards (a quarter of the keys in both);
- memory: the peak RSS a load adds, in a fresh process.

``--scale M`` (e.g. 1000000) also times, in fresh processes, a load of M entries and the
``pytest-arbiter`` commands ``show`` (table to /dev/null), ``show --json``, ``diff`` and
``merge`` of two M-entry corpora (three quarters of the keys in both), reporting wall
time, CPU time and peak RSS; ``--data DIR`` keeps those corpora for the next run.
``--shards`` times ``pytest-arbiter merge`` of 2, 8 and 32 shards of 10,000 entries.
``--tune N`` times ``pytest --arbiter-tune`` measuring 10 new keys beside an N-entry
corpus against the same run with no cache file (R runs each, alternating).
``--skip-small`` leaves out the 100k comparison. docs/performance.md ("The store") has
the figures.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench_merge import entry_fields, make_entries

REPO = Path(__file__).resolve().parents[1]
V2_COMMIT = "e8e4ab3"
"""The last commit with the version 2 cache code."""


def v2_package(commit: str, into: Path) -> Path:
    """The package of ``commit`` under ``into`` as ``arbiter_v2``; returns its parent."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "pytest_arbiter"],
                             capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    package = into / "arbiter_v2"
    (into / "pytest_arbiter").rename(package)
    for path in package.rglob("*.py"):
        path.write_text(path.read_text().replace("pytest_arbiter", "arbiter_v2"))
    return into


def v2_entries(v2: dict[str, ModuleType], n: int, *, seed: int, host: str,
               start: int = 0) -> list[Any]:
    cache, measure = v2["cache"], v2["measure"]
    return [cache.CacheEntry(
        f["device"], f["target"], f["op"], f["bucket"], f["dtype"],
        tuple(cache.RankedCandidate(r[0], measure.LatencyStats(*r[1:])) for r in f["ranking"]),
        f["confidence"], False, {}, f["provenance"])
        for f in entry_fields(n, seed=seed, host=host, start=start)]


def best(fn: Callable[[], Any], repeat: int) -> float:
    """The median wall time of ``repeat`` calls (the machine may be shared)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
        del result
    return statistics.median(times)


def tracked_after(load: Callable[[], Any]) -> tuple[int, float]:
    """Objects the collector tracks after ``load()`` (what it walks), and how long one
    full collection takes while the result is alive."""
    gc.collect()
    before = len(gc.get_objects())
    loaded = load()
    tracked = len(gc.get_objects()) - before
    start = time.perf_counter()
    gc.collect()
    full = time.perf_counter() - start
    del loaded
    return tracked, full


HWM = ("def hwm():\n"
       "    for line in open('/proc/self/status'):\n"
       "        if line.startswith('VmHWM:'):\n"
       "            return int(line.split()[1])\n")
"""The process's peak RSS in kB (``ru_maxrss`` would carry the parent's across exec)."""

PEAK = (HWM + "import sys; sys.path[:0] = sys.argv[1:3]\n"
        "from {package} import artifacts\n"
        "base = hwm()\n"
        "cache = artifacts.read_cache(sys.argv[3])\n"
        "print(len(cache), hwm() - base, base)\n")


def load_peak(package: str, path: Path, v2_root: Path) -> tuple[float, float, float, float]:
    """(wall s of the load, its CPU s, peak RSS the load added, RSS after imports; both
    MB) in a fresh process."""
    code = ("import time\n" + PEAK.format(package=package).replace(
        "cache = ", "t, c = time.perf_counter(), time.process_time()\ncache = ")
        + "print(time.perf_counter() - t, time.process_time() - c)\n")
    out = subprocess.run([sys.executable, "-c", code, str(v2_root), str(REPO), str(path)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[3]), float(out[4]), int(out[1]) / 1024, int(out[2]) / 1024


CLI = (HWM + "import atexit, os, sys; sys.path[:0] = sys.argv[1:3]\n"
       "atexit.register(lambda: sys.stderr.write('PEAK %d\\n' % hwm()))\n"
       "try:\n"
       "    from {package}.cli.main import main\n"
       "except ImportError:  # version 2's cli was one module\n"
       "    from {package}.cli import main\n"
       "sys.exit(main(sys.argv[3:], out=open(os.devnull, 'w')))\n")


def children_cpu() -> float:
    """CPU seconds (user and system) of the finished child processes so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def children_sys() -> float:
    """System CPU seconds of the finished child processes so far."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime


def cli(package: str, v2_root: Path, *argv: str | Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MB) of ``pytest-arbiter ARGV`` in a fresh process. The CPU
    time is what a loaded machine changes least; :data:`LAST_SYS` holds its system part
    (page faults, the page cache of a file written: the part a virtual machine's state
    changes most)."""
    global LAST_SYS
    cpu, sys_cpu = children_cpu(), children_sys()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", CLI.format(package=package), str(v2_root),
                           str(REPO), *map(str, argv)], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{package} {argv}: {done.stderr[-2000:]}")
    peak = int(done.stderr.rsplit("PEAK ", 1)[1].split()[0]) / 1024
    LAST_SYS = children_sys() - sys_cpu
    return wall, children_cpu() - cpu, peak


LAST_SYS = 0.0
"""The system CPU seconds of the last :func:`cli` process."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int,
                        help="entries (100,000; with --make-corpus, 1,000,000)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--v2", default=V2_COMMIT, help="the commit of the version 2 code")
    parser.add_argument("--scale", type=int, default=0,
                        help="also time load/show/diff/merge of this many entries")
    parser.add_argument("--shards", action="store_true",
                        help="also time pytest-arbiter merge of 2, 8, 32 shards of 10k")
    parser.add_argument("--tune", type=int, default=0, metavar="N",
                        help="also time pytest --arbiter-tune measuring 10 new keys beside an "
                        "N-entry corpus against an empty cache")
    parser.add_argument("--data", metavar="DIR",
                        help="keep the --scale corpora (v3) in DIR and reuse them")
    parser.add_argument("--skip-small", action="store_true",
                        help="only the --scale and --shards parts")
    parser.add_argument("--scale-formats", default="v2,v3",
                        help="which formats --scale runs (v2 takes minutes at 1M)")
    parser.add_argument("--make-corpus", nargs="+", metavar="PATH",
                        help="write a corpus of --entries entries (default 1,000,000) at "
                        "PATH (or: N PATH) and exit")
    parser.add_argument("--seed", type=int, default=1, help="the --make-corpus seed")
    parser.add_argument("--commands", nargs=2, metavar=("A", "B"),
                        help="time the pytest-arbiter commands on corpora A and B and exit")
    parser.add_argument("--code", metavar="DIR", type=Path, default=REPO,
                        help="--commands runs the package in DIR (a git worktree of another "
                        "commit, to compare); default this checkout")
    parser.add_argument("--first-test", metavar="PATH", type=Path,
                        help="time a pytest run reading the corpus PATH up to its first "
                        "test, beside a raw scan of PATH, for --code and each --before DIR")
    parser.add_argument("--before", metavar="DIR", type=Path, action="append", default=[],
                        help="--first-test also runs the package in DIR (an older tree)")
    parser.add_argument("--skip", default="", metavar="NAMES",
                        help="--commands leaves these out (comma-separated, e.g. gate,report)")
    args = parser.parse_args()
    if args.make_corpus:
        path, n = corpus_args(parser, args)
        t = time.perf_counter()
        make_corpus(path, n, args.seed)
        print(f"{path}: {n:,} entries, seed {args.seed}, {path.stat().st_size / 1e6:.0f} MB "
              f"in {time.perf_counter() - t:.0f} s")
        return 0
    if args.commands:
        commands(*map(Path, args.commands), args.repeat, args.code,
                 set(filter(None, args.skip.split(","))))
        return 0
    if args.first_test:
        first_test(args.first_test, [*args.before, args.code], args.repeat)
        return 0
    print(f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} CPUs; Python {sys.version.split()[0]}", flush=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        v2_root = v2_package(args.v2, tmp / "src")
        sys.path.insert(0, str(v2_root))
        import importlib

        v2 = {m: importlib.import_module(f"arbiter_v2.{m}")
              for m in ("artifacts", "cache", "corpus", "measure")}
        from pytest_arbiter.store import artifacts, corpus
        from pytest_arbiter.store.cache import MeasureCache

        if not args.skip_small:
            small(args, tmp, v2_root, v2, artifacts, corpus, MeasureCache)
        if args.scale:
            scale(args.scale, tmp, Path(args.data) if args.data else tmp, v2_root, v2,
                  artifacts, MeasureCache,
                  args.scale_formats.split(","))
        if args.shards:
            shards(tmp, v2_root, artifacts, MeasureCache)
        if args.tune:
            tune(args.tune, 10, args.repeat, tmp, artifacts, MeasureCache)
    return 0


def corpus_args(parser: argparse.ArgumentParser, args: argparse.Namespace
                ) -> tuple[Path, int]:
    """``--make-corpus PATH`` (with ``--entries``, here 1,000,000 by default) or
    ``--make-corpus N PATH``."""
    given = args.make_corpus
    if len(given) == 1:
        return Path(given[0]), args.entries or 1_000_000
    if len(given) == 2 and given[0].replace("_", "").isdigit():
        return Path(given[1]), int(given[0])
    parser.error("--make-corpus takes PATH, or N PATH")


CORPUS_CHUNK = 100_000
"""Entries built at a time by :func:`make_corpus` (their builtins are large)."""


def make_corpus(path: Path, n: int, seed: int) -> None:
    """A realistic ``n``-entry corpus at ``path``, keys from ``(seed - 1) * 3n/4``."""
    from pytest_arbiter.store import artifacts
    from pytest_arbiter.store.cache import MeasureCache

    start, host = (seed - 1) * (n * 3 // 4), f"runner-{seed}"
    entries = []
    for at in range(0, n, CORPUS_CHUNK):
        entries += make_entries(min(CORPUS_CHUNK, n - at), seed=seed * 1_000_003 + at,
                                host=host, start=start + at)
    artifacts.write_cache(path, MeasureCache(entries))


def histogram_pair(n: int, tmp: Path) -> tuple[Path, Path]:
    """A run's histogram of ``n`` entries (half of them degraded, rejected or error) and
    a baseline that knows every one of those and ``n // 10`` keys the run no longer
    shows: what ``gate`` reads at scale, and passes."""
    from pytest_arbiter.gating import histogram_file
    from pytest_arbiter.gating.histogram import GATED_OUTCOMES, HistogramKey

    outcomes = ("won", "degraded", "no_candidate", "rejected", "won", "error")

    def key(i: int) -> HistogramKey:
        return HistogramKey(f"target{i % 4}", f"op{i // 6 % 5000}", f"cand{i // 30000}",
                            outcomes[i % 6])

    run = {key(i): 1 + i % 97 for i in range(n)}
    base = {k: 1 for k in run if k.outcome in GATED_OUTCOMES}
    base.update((key(i), 1) for i in range(n, n + n // 10) if outcomes[i % 6] in GATED_OUTCOMES)
    paths = tmp / "run-histogram.json", tmp / "baseline.json"
    histogram_file.write_histogram(paths[0], run)
    histogram_file.write_histogram(paths[1], base)
    return paths


def scan_cpu(path: Path) -> float:
    """CPU seconds of reading ``path`` and scanning it once as JSON, in this process."""
    import msgspec

    start = time.process_time()
    with open(path, "rb") as file:
        data = file.read()
    msgspec.json.decode(data, type=msgspec.Raw)
    del data
    return time.process_time() - start


def commands(a: Path, b: Path, repeat: int, code: Path, skip: set[str]) -> None:
    """Each ``pytest-arbiter`` command in a fresh process beside raw scans of its files,
    the package taken from ``code``."""
    from pytest_arbiter.store.artifacts import read_cache

    n = len(read_cache(a))
    with tempfile.TemporaryDirectory(dir=a.parent) as tmp_name:
        tmp = Path(tmp_name)
        run_hist, baseline = histogram_pair(n, tmp)
        html = tmp / "report.html"
        runs = (("show", ["show", a], [a]),
                ("show --json", ["show", "--json", a], [a]),
                ("diff", ["diff", a, b], [a, b]),
                ("merge", ["merge", "-o", tmp / "merged.json", a, b], [a, b]),
                ("forget", ["forget", "--op", "softmax", "--dry-run", a], [a]),
                ("gate", ["gate", "--baseline", baseline, run_hist], [run_hist, baseline]),
                ("report", ["report", a, "-o", html], [a]))
        start_cpu = statistics.median(cli_start(code) for _ in range(3))
        print(f"{code}: {n:,} entries ({a.stat().st_size / 1e6:.0f} MB, "
              f"{b.stat().st_size / 1e6:.0f} MB); each command a fresh process running "
              f"main(argv) (its CPU includes {start_cpu:.2f} s of start-up and imports); "
              f"the scans in this process, median of {repeat}", flush=True)
        print(f"{'command':14}{'CPU s':>8}{'(sys)':>7}{'scan s':>8}{'ratio':>7}"
              f"{'peak RSS':>10}{'wall s':>8}  load average", flush=True)
        for name, argv, files in runs:
            if name in skip:
                continue
            scans = sum(statistics.median(scan_cpu(f) for _ in range(repeat)) for f in files)
            load = open("/proc/loadavg").read().split()[:3]
            try:
                wall, cpu, peak = cli("pytest_arbiter", code, *argv)
            except RuntimeError as exc:
                print(f"{name:14}failed: {exc}", flush=True)
                continue
            finally:
                (tmp / "merged.json").unlink(missing_ok=True)
            print(f"{name:14}{cpu:8.2f}{LAST_SYS:7.2f}{scans:8.2f}{cpu / scans:6.1f}x"
                  f"{peak:7.0f} MB{wall:8.2f}  {' '.join(load)}", flush=True)


FIRST_TEST = """
import time


def test_first():
    with open("first.txt", "w") as out:
        out.write(str(time.process_time()))
"""


def first_test(corpus: Path, trees: list[Path], repeat: int) -> None:
    """CPU seconds of a fresh ``pytest --arbiter-cache=CORPUS`` process up to the start of
    its first test (its own ``time.process_time()`` there: start-up, plugins, the
    corpus read), for the package of each tree, interleaved, beside a raw scan of the
    corpus (read and ``msgspec.Raw``) in this process; the median of ``repeat`` each."""
    with tempfile.TemporaryDirectory() as tmp_name:
        project = Path(tmp_name)
        (project / "test_first.py").write_text(FIRST_TEST)
        seen: dict[Path, list[float]] = {tree: [] for tree in trees}
        scans, loads = [], []
        for _ in range(repeat):
            scans.append(scan_cpu(corpus))
            for tree in trees:
                loads.append(open("/proc/loadavg").read().split()[0])
                env = {**os.environ, "PYTHONPATH": str(tree)}
                subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                "no:cacheprovider", f"--arbiter-cache={corpus}"],
                               cwd=project, env=env, check=True, capture_output=True)
                seen[tree].append(float((project / "first.txt").read_text()))
        scan = statistics.median(scans)
        print(f"{corpus} ({corpus.stat().st_size / 1e6:.0f} MB): CPU to the first test, "
              f"median of {repeat}, against the raw scan {scan:.2f} s (target 5x); load "
              f"average at each start {' '.join(loads)}")
        for tree, cpus in seen.items():
            median = statistics.median(cpus)
            print(f"  {tree}: {median:.2f} s ({', '.join(f'{c:.2f}' for c in cpus)}), "
                  f"{median / scan:.1f}x the scan", flush=True)


def cli_start(code: Path) -> float:
    """CPU seconds of a fresh process that imports the CLI of ``code`` and exits."""
    cpu = children_cpu()
    subprocess.run([sys.executable, "-c", f"import sys; sys.path[:0] = [{str(code)!r}]; "
                    "import pytest_arbiter.cli.main"], check=True)
    return children_cpu() - cpu


def small(args: argparse.Namespace, tmp: Path, v2_root: Path, v2: dict[str, ModuleType],
          artifacts: Any, corpus: Any, measure_cache: Any) -> None:
    n, repeat = args.entries or 100_000, args.repeat
    paths = {(fmt, shard): tmp / f"{fmt}-{shard}.json" for fmt in ("v2", "v3")
             for shard in "ab"}
    for shard, seed, host, start in (("a", 1, "runner-a", 0), ("b", 2, "runner-b", n * 3 // 4)):
        v2["artifacts"].write_cache(paths["v2", shard], v2["cache"].MeasureCache(
            v2_entries(v2, n, seed=seed, host=host, start=start)))
        artifacts.write_cache(paths["v3", shard], measure_cache(
            make_entries(n, seed=seed, host=host, start=start)))
    readers = {"v2": v2["artifacts"].read_cache, "v3": artifacts.read_cache}
    writers = {"v2": v2["artifacts"].write_cache, "v3": artifacts.write_cache}
    mergers = {"v2": v2["corpus"].merge, "v3": corpus.merge}
    rows: dict[str, dict[str, str]] = {"v2": {}, "v3": {}}
    loads: dict[str, list[float]] = {"v2": [], "v3": []}
    for _ in range(repeat):  # interleaved, so a busy moment hits both
        for fmt in ("v2", "v3"):
            loads[fmt].append(best(lambda f=fmt: readers[f](paths[f, "a"]), 1))
    write_built = {}
    for fmt in ("v2", "v3"):  # first, and let go of: built entries are tracked in v2
        built = (v2["cache"].MeasureCache(v2_entries(v2, n, seed=1, host="runner-a"))
                 if fmt == "v2" else measure_cache(make_entries(n, seed=1, host="runner-a")))
        write_built[fmt] = best(lambda f=fmt, b=built: writers[f](tmp / "built.json", b),
                                repeat)
        del built
        gc.collect()
    for fmt in ("v2", "v3"):
        loaded = readers[fmt](paths[fmt, "a"])
        other = readers[fmt](paths[fmt, "b"])
        out = tmp / f"{fmt}-out.json"
        write = best(lambda f=fmt, c=loaded, o=out: writers[f](o, c), repeat)
        merge = best(lambda f=fmt, a=loaded, b=other: mergers[f](a, b), repeat)
        del loaded, other
        tracked, full = tracked_after(lambda f=fmt: readers[f](paths[f, "a"]))
        _, _, peak, _ = load_peak(f"{'arbiter_v2' if fmt == 'v2' else 'pytest_arbiter'}",
                                     paths[fmt, "a"], v2_root)
        rows[fmt] = {
            "file": f"{paths[fmt, 'a'].stat().st_size / 1e6:.0f} MB",
            "load": f"{statistics.median(loads[fmt]):.3f} s",
            "write (read cache)": f"{write:.3f} s",
            "write (built entries)": f"{write_built[fmt]:.3f} s",
            "tracked after load": f"{tracked:,}", "full collection": f"{full * 1e3:.0f} ms",
            "merge": f"{merge:.3f} s", "load peak RSS": f"+{peak:.0f} MB",
        }
    print(f"\n{n:,} entries, median of {repeat}, GC on; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}:")
    print(f"{'':24}{'version 2':>14}{'version 3':>14}  ratio")
    for key in rows["v2"]:
        a, b = rows["v2"][key], rows["v3"][key]
        ratio = ""
        try:
            x, y = (float(v.split()[0].lstrip("+").replace(",", "")) for v in (a, b))
            ratio = f"{y / x:.2f}" if x else ""
        except ValueError:
            pass
        print(f"{key:24}{a:>14}{b:>14}  {ratio}")
    print(f"loads v2: {', '.join(f'{t:.3f}' for t in loads['v2'])}; "
          f"v3: {', '.join(f'{t:.3f}' for t in loads['v3'])}", flush=True)


def scale(m: int, tmp: Path, data: Path, v2_root: Path, v2: dict[str, ModuleType],
          artifacts: Any, measure_cache: Any, formats: list[str]) -> None:
    """Load, show, diff and merge of M-entry corpora, each in a fresh process."""
    print(f"\n{m:,} entries (fresh processes; wall time includes start-up and imports):",
          flush=True)
    files: dict[tuple[str, str], Path] = {}
    for shard, seed, host, start in (("a", 1, "runner-a", 0), ("b", 2, "runner-b", m // 4)):
        t = time.perf_counter()
        path = files["v3", shard] = data / f"big-{m}-v3-{shard}.json"
        if not path.exists():  # kept in --data DIR between runs
            artifacts.write_cache(path, measure_cache(make_entries(m, seed=seed, host=host,
                                                                   start=start)))
        gc.collect()
        if "v2" in formats:
            path = files["v2", shard] = tmp / f"big-v2-{shard}.json"
            v2["artifacts"].write_cache(path, v2["cache"].MeasureCache(
                v2_entries(v2, m, seed=seed, host=host, start=start)))
            gc.collect()
        print(f"  built shard {shard} in {time.perf_counter() - t:.0f} s ("
              + ", ".join(f"{fmt} {files[fmt, shard].stat().st_size / 1e6:.0f} MB"
                          for fmt in formats) + ")", flush=True)
    for fmt, package in (("v2", "arbiter_v2"), ("v3", "pytest_arbiter")):
        if fmt not in formats:
            continue
        wall, cpu, peak, base = load_peak(package, files[fmt, "a"], v2_root)
        print(f"  {fmt} load: {wall:.2f} s (CPU {cpu:.2f} s), peak RSS +{peak:.0f} MB over "
              f"{base:.0f} MB after imports", flush=True)
        for name, argv in (("show", ["show", files[fmt, "a"]]),
                           ("show --json", ["show", "--json", files[fmt, "a"]]),
                           ("diff", ["diff", files[fmt, "a"], files[fmt, "b"]]),
                           ("merge", ["merge", "-o", tmp / f"merged-{fmt}.json",
                                      files[fmt, "a"], files[fmt, "b"]])):
            try:
                wall, cpu, peak = cli(package, v2_root, *argv)
                print(f"  {fmt} pytest-arbiter {name}: {wall:.2f} s (CPU {cpu:.2f} s), peak "
                      f"RSS {peak:.0f} MB", flush=True)
            except RuntimeError as exc:
                print(f"  {fmt} pytest-arbiter {name}: failed: {exc}", flush=True)
            (tmp / f"merged-{fmt}.json").unlink(missing_ok=True)


def shards(tmp: Path, v2_root: Path, artifacts: Any, measure_cache: Any) -> None:
    """``pytest-arbiter merge`` of 2, 8, 32 shards of 10,000 entries (each shard's keys
    overlap the next one's by a quarter)."""
    print("\npytest-arbiter merge of shards of 10,000 entries (fresh processes):", flush=True)
    paths = []
    for i in range(32):
        path = tmp / f"shard-{i:02d}.json"
        artifacts.write_cache(path, measure_cache(make_entries(
            10_000, seed=100 + i, host=f"runner-{i}", start=i * 7_500)))
        paths.append(path)
    for count in (2, 8, 32):
        out = tmp / f"corpus-{count}.json"
        wall, cpu, peak = cli("pytest_arbiter", v2_root, "merge", "-o", out, *paths[:count])
        merged = len(artifacts.read_cache(out))
        print(f"  {count:2d} shards ({count * 10_000:,} entries in): {wall:.2f} s (CPU "
              f"{cpu:.2f} s), peak RSS {peak:.0f} MB, {merged:,} entries out", flush=True)


TUNE_CONFTEST = """
import numpy as np
import pytest_arbiter

pytest_arbiter.op("bench_scale", reference=lambda x: x * 2)


@pytest_arbiter.candidate("bench_scale", target="cpu", name="bench_add", tier=1)
def add(x):
    return x + x


@pytest_arbiter.candidate("bench_scale", target="cpu", name="bench_mul", tier=0)
def mul(x):
    return x * 2
"""

TUNE_TESTS = """
import numpy as np
import pytest
import pytest_arbiter


@pytest.mark.parametrize("n", [2 ** i for i in range(1, {keys} + 1)])
def test_scale(n):
    pytest_arbiter.dispatch("bench_scale", np.ones(n, np.float32))
"""


def tune(corpus_entries: int, keys: int, repeat: int, tmp: Path, artifacts: Any,
         measure_cache: Any) -> None:
    """``pytest --arbiter-tune`` in a fresh process on a small project whose tests
    measure ``keys`` new keys (an op with two cheap candidates, ``keys`` sizes), with a
    corpus of ``corpus_entries`` other entries beside them against an empty cache (no
    file). Wall time of the whole run, median of ``repeat``, interleaved; every run
    starts from the same corpus file."""
    print(f"\npytest --arbiter-tune measuring {keys} new keys, a {corpus_entries:,}-entry "
          f"corpus vs no cache (fresh processes, median of {repeat}):", flush=True)
    project = tmp / "tune-project"
    project.mkdir()
    (project / "conftest.py").write_text(TUNE_CONFTEST)
    (project / "test_tune.py").write_text(TUNE_TESTS.format(keys=keys))
    corpus = tmp / "tune-corpus.json"
    artifacts.write_cache(corpus, measure_cache(make_entries(corpus_entries, seed=7,
                                                             host="runner-t")))
    pristine = corpus.read_bytes()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    times: dict[str, list[float]] = {"empty": [], "corpus": []}
    cpus: dict[str, list[float]] = {"empty": [], "corpus": []}
    for _ in range(repeat):
        for kind in ("empty", "corpus"):
            cache = project / "cache.json"
            cache.unlink(missing_ok=True)
            if kind == "corpus":
                cache.write_bytes(pristine)
            start, cpu = time.perf_counter(), children_cpu()
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p",
                                   "no:cacheprovider", "--arbiter-tune",
                                   f"--arbiter-cache={cache}"], cwd=project, env=env,
                                  capture_output=True, text=True)
            times[kind].append(time.perf_counter() - start)
            cpus[kind].append(children_cpu() - cpu)
            if done.returncode != 0:
                raise RuntimeError(f"tune run ({kind}): {done.stdout[-3000:]}")
            added = len(artifacts.read_cache(cache))
            expected = keys + (corpus_entries if kind == "corpus" else 0)
            if added != expected:
                raise RuntimeError(f"tune run ({kind}): {added} entries, not {expected}")
    for kind, label in (("empty", "no cache"), ("corpus", f"{corpus_entries:,}-entry corpus")):
        print(f"  {label}: wall {statistics.median(times[kind]):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in times[kind])}), CPU "
              f"{statistics.median(cpus[kind]):.2f} s "
              f"({', '.join(f'{t:.2f}' for t in cpus[kind])})")
    wall = statistics.median(times["corpus"]) / statistics.median(times["empty"])
    cpu = statistics.median(cpus["corpus"]) / statistics.median(cpus["empty"])
    paired = statistics.median(c / e for c, e in zip(cpus["corpus"], cpus["empty"],
                                                      strict=True))
    print(f"  ratio: wall {wall:.2f}x, CPU {cpu:.2f}x (paired median {paired:.2f}x); load "
          f"average {', '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
