"""What the CLI prints for a person: percentages with one sign, and a quiet exit when
the reader of its output goes away (``pytest-arbiter show ... | head``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_arbiter.cli.main import main
from pytest_arbiter.gating import histogram_file
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import MeasureCache
from tests.factories import ROOT, ranked_entry


def show(path: Path) -> str:
    out = io.StringIO()
    assert main(["show", "--wide", str(path)], out=out) == 0
    return out.getvalue()


def test_runner_up_percentages_have_one_sign(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    artifacts.write_cache(path, MeasureCache([
        ranked_entry("m1", "wmma", "cublas", medians=(1000.0, 1500.0)),
        # a tie broken by tier: the runner-up's median is 1.1% below the winner's
        ranked_entry("m2", "wmma", "cublas", medians=(1000.0, 989.0), tie=True),
        ranked_entry("m3", "wmma", "cublas", medians=(1000.0, 989.0))]))
    text = show(path)
    assert "+-" not in text
    rows = {line.split()[3]: line for line in text.splitlines()[1:-1]}
    assert "cublas +50.0%" in rows["m1"]
    assert "cublas \u00b11.1%" in rows["m2"]
    assert "cublas -1.1%" in rows["m3"]


def test_show_and_diff_say_the_paired_ratio_that_ranked_the_rows(tmp_path: Path) -> None:
    """The runner-up's own median is 5% below the winner's, but it lost most of the
    rounds timed side by side: its paired ratio (1.031) is what ranked it, and what
    ``show`` and ``diff`` print; nothing contradicts the order."""
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    artifacts.write_cache(old, MeasureCache([ranked_entry("m1", "cublas", "wmma")]))
    artifacts.write_cache(new, MeasureCache([
        ranked_entry("m1", "wmma", "cublas", medians=(1000.0, 950.0), ratios=(1.0, 1.031))]))
    text = show(new)
    assert "cublas +3.1%" in text.splitlines()[1]
    assert "lower median" not in text and "*" not in text
    out = io.StringIO()
    assert main(["diff", str(old), str(new)], out=out) == 0
    assert "cublas now 3.1% slower" in out.getvalue()
    assert "low-confidence" not in out.getvalue()
    artifacts.write_cache(new, MeasureCache([ranked_entry(
        "m1", "wmma", "cublas", medians=(1000.0, 950.0), ratios=(1.0, 1.031),
        confidence=0.6)]))
    out = io.StringIO()
    assert main(["diff", str(old), str(new)], out=out) == 0
    assert "now 3.1% slower; new pick low-confidence" in out.getvalue()
    (row,) = [r for r in artifacts.read_entries(new)[0].ranking if r.name == "cublas"]
    assert row.ratio == 1.031
    out = io.StringIO()
    assert main(["show", "--json", str(new)], out=out) == 0
    (shown,) = json.loads(out.getvalue())
    assert [r.get("ratio") for r in shown["ranking"]] == [1.0, 1.031]
    assert shown == artifacts.read_entries(new)[0].to_dict()


def test_diff_says_faster_of_an_old_winner_that_is_faster_now(tmp_path: Path) -> None:
    """The old winner lost the new comparison on the tie rule though its paired ratio is
    0.996: 0.4% faster, not "-0.4% slower"."""
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    artifacts.write_cache(old, MeasureCache([ranked_entry("m1", "dot_matmul", "blas_matmul")]))
    artifacts.write_cache(new, MeasureCache([ranked_entry(
        "m1", "blas_matmul", "dot_matmul", medians=(1000.0, 996.0), ratios=(1.0, 0.996),
        tie=True)]))
    out = io.StringIO()
    assert main(["diff", str(old), str(new)], out=out) == 0
    assert "; dot_matmul now 0.4% faster; new pick a tie (" in out.getvalue()
    assert "slower" not in out.getvalue()


def _big_cache(path: Path, n: int = 3000) -> None:
    artifacts.write_cache(path, MeasureCache(
        [ranked_entry(f"m{i}", "wmma", "cublas", medians=(1000.0, 1500.0)) for i in range(n)]))


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_show_into_head_exits_quietly(tmp_path: Path) -> None:
    """A real pipe: head reads two lines and exits while show still writes (far more
    than a pipe's buffer)."""
    path = tmp_path / "big.json"
    _big_cache(path)
    script = (f"set -o pipefail; {sys.executable} -m pytest_arbiter.cli.main show {path} "
              "| head -n 2")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert len(done.stdout.splitlines()) == 2


def test_closed_pipe_from_python(tmp_path: Path) -> None:
    """The reader closes the pipe after one line: no traceback, exit 0."""
    path = tmp_path / "big.json"
    _big_cache(path)
    proc = subprocess.Popen([sys.executable, "-m", "pytest_arbiter.cli.main", "show", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 0
    assert err == b""


class _GoneReader(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_cut_off_gate_never_passes(tmp_path: Path) -> None:
    report = tmp_path / "h.json"
    histogram_file.write_histogram(report, {("cpu", "matmul", "blas_matmul", "won"): 1})
    code = main(["gate", "--baseline", str(tmp_path / "none.json"), str(report)],
                out=_GoneReader())
    assert code == 2
