"""The pytest-benchmark export (``--arbiter-benchmark-json=PATH`` and ``pytest-arbiter
export --format pytest-benchmark CACHE``), read back by pytest-benchmark's own storage
and compare code: what ``pytest-benchmark compare`` and github-action-benchmark read."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, MeasureCache, RankedCandidate

pytest.importorskip("pytest_benchmark")
from pytest_benchmark.storage.file import FileStorage

from tests.factories import stats


class StrictLogger:
    """pytest-benchmark's logger interface; a warning (its storage's "Failed to load")
    fails the test instead of being skipped over."""

    def warning(self, text: str, **_: Any) -> None:
        raise AssertionError(text)

    def info(self, text: str, **_: Any) -> None:
        pass

    debug = info


def corpus(path: Path) -> Path:
    artifacts.write_cache(path, MeasureCache([
        CacheEntry("sm_90", "nvidia", "matmul", "64x64x64", "float16", (
            RankedCandidate("wmma", stats(1000.0, 40, spread=0.2)),
            RankedCandidate("cublas", stats(1500.0, 40, spread=0.2)),
            RankedCandidate("old_naive", stats(9000.0, 40, spread=0.2), carried=True)),
            0.999, False, {}, {"host": "h1", "measured_at": "2026-12-03T06:00:00Z"}),
        CacheEntry("cpu-x86", "cpu", "softmax", "64x128/c", "float32", (
            RankedCandidate("fused", stats(500.0, 40, spread=0.2)),), 1.0),
    ]))
    return path


def load(path: Path) -> list[dict[str, Any]]:
    storage = FileStorage(path.parent / "storage", logger=StrictLogger())
    return list(storage.load_benchmarks(str(path)))


def test_export_is_read_by_pytest_benchmarks_storage(tmp_path: Path) -> None:
    out_path = tmp_path / "bench.json"
    out = io.StringIO()
    code = main(["export", "--format", "pytest-benchmark", str(corpus(tmp_path / "c.json")),
                 "-o", str(out_path)], out=out)
    assert code == 0, out.getvalue()
    assert "3 benchmarks from 2 entries" in out.getvalue()
    loaded = {b["fullname"]: b for b in load(out_path)}
    # one per key and candidate timed in the latest comparison: the carried row is out
    assert sorted(loaded) == ["cpu-x86/cpu/softmax/64x128/c/float32::fused",
                              "sm_90/nvidia/matmul/64x64x64/float16::cublas",
                              "sm_90/nvidia/matmul/64x64x64/float16::wmma"]
    wmma = loaded["sm_90/nvidia/matmul/64x64x64/float16::wmma"]
    assert wmma["group"] == "sm_90/nvidia/matmul/64x64x64/float16"
    assert wmma["name"] == "wmma" and wmma["rounds"] == 40
    assert wmma["median"] == pytest.approx(1e-6) and wmma["min"] == pytest.approx(0.8e-6)
    assert wmma["ops"] == pytest.approx(1e6)
    assert wmma["extra_info"]["arbiter_winner"] is True
    cublas = loaded["sm_90/nvidia/matmul/64x64x64/float16::cublas"]
    assert cublas["extra_info"]["arbiter_median_over_winner"] == pytest.approx(1.5)


def test_pytest_benchmark_compare_tabulates_the_export(tmp_path: Path) -> None:
    out_path = tmp_path / "bench.json"
    assert main(["export", "--format", "pytest-benchmark", str(corpus(tmp_path / "c.json")),
                 "-o", str(out_path)], out=io.StringIO()) == 0
    done = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare",
                           "--columns=min,median,rounds", "--group-by=group",
                           str(out_path)], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "Failed to load" not in text + done.stderr
    for name in ("wmma", "cublas", "fused", "sm_90/nvidia/matmul/64x64x64/float16"):
        assert name in text, text


def test_export_to_standard_output_and_filters(tmp_path: Path) -> None:
    out = io.StringIO()
    assert main(["export", "--format", "pytest-benchmark", "--op", "softmax",
                 str(corpus(tmp_path / "c.json"))], out=out) == 0
    doc = json.loads(out.getvalue())
    assert [b["name"] for b in doc["benchmarks"]] == ["fused"]
    assert {"machine_info", "commit_info", "datetime", "version"} <= set(doc)


BENCH = '''
import numpy as np
import pytest_arbiter


def test_timed(benchmark):
    a = np.ones((32, 32), np.float32)
    benchmark(lambda: pytest_arbiter.dispatch("matmul", a, a))
'''


def test_a_tuning_run_writes_its_comparisons_for_pytest_benchmark(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--arbiter-tune", "--arbiter-cache=c.json",
        "--arbiter-histogram=h.json", "--arbiter-benchmark-json=out/bench.json",
        "--benchmark-json=theirs.json")
    assert result.ret == 0, result.stdout.str()
    # pytest-benchmark's rounds count once in the histogram
    entries = json.loads((pytester.path / "h.json").read_text())["entries"]
    assert sum(e["count"] for e in entries) == 1, entries
    ours = load(pytester.path / "out" / "bench.json")
    cache = artifacts.read_cache(pytester.path / "c.json")
    (entry,) = cache.entries()
    timed = [row.name for row in entry.ranking if not row.carried]
    assert sorted(b["name"] for b in ours) == sorted(timed)
    assert {b["group"] for b in ours} == {"/".join(entry.key)}
    # pytest-benchmark's own file of the same run loads beside ours
    theirs = load(pytester.path / "theirs.json")
    assert [b["name"] for b in theirs] == ["test_timed"]


def test_a_run_that_measured_nothing_writes_an_empty_document(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench=BENCH.replace("benchmark(lambda: ", "(lambda: ")
                        .replace("(benchmark)", "()"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--arbiter-benchmark-json=bench.json")
    assert result.ret == 0, result.stdout.str()
    doc = json.loads((pytester.path / "bench.json").read_text())
    assert doc["benchmarks"] == []
    assert "id" in doc["commit_info"] or "error" in doc["commit_info"]
