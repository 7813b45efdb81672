"""The store's commands on a realistic 10,000-entry corpus print, and write, byte for byte
what they did before the streamed reads, diff and merge (the digests were taken from
that code; again when latencies took three significant digits, the summary line its
singulars, diff a mark on low-confidence picks, and diff's old winner "now 50.0% slower"
or "faster" without a sign): ``show`` (narrow, wide, JSON,
filtered), ``diff`` both ways, ``merge`` (with and without conflicts, and the merged
files), ``forget`` (dry runs and one that writes)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import MeasureCache
from tests.factories import ROOT

DIGESTS = {
    "file a": (0, "22dfe135be8ea17b3e4b505d958c8462eea14df6a9b7f25f3c0ce8520573006e"),
    "show": (0, "d4e073752f9161393b8d446c906f6674a89257973a9142c210aff36af2b34a45"),
    "show --wide": (0, "e01358c64ad37f567243a841ae5ac682c134d15055905d4665ed30d393fe8636"),
    "show --json": (0, "be35d42a602ec47a6e49d9542c37ae1f80f8cf46bd3e4d309617c43520568bde"),
    "show --device --op": (
        0, "c76be311a34dadf62037c4fd94c96689ac1b7ba763b28179f03d451d705a2b1e"),
    "diff a b": (0, "3b870cafd2796f8a64dd90dd1817f30066ea877c09a10dbcdd4afa1bf84fb41b"),
    "diff b a": (0, "4432a318c8c636b20ace317d0fee7e0731ec30efd44997a718db8fbc87483e99"),
    "merge": (0, "79bbdb148b7328449b00bf959796120ee5f518f5a5a3aafe337283bc5b669ad7"),
    "merged file": (0, "54cd2c922405a140997e0b91acc559b0cfb4173c95457a9eebffc4ad6386944f"),
    "forget dry": (0, "87f499f627e92575101f8f12ea58ab345085e5447162a2db1650f6cdc515fdbb"),
    "forget": (0, "391c8bedce6317036cfa24b95ef8dde2cfe2affcbca51c367029885a1e33bcc5"),
    "forgotten file": (0, "45eedea09790d0d18c1a6d412ef1e59842175c740ff65a3b063fce49ba4f1c63"),
    "merge conflicts": (1, "926bdbebd1f787c0814b8b29a4826c0994165254f3192621a180b86ae55f69bf"),
    "merged conflicts file": (
        0, "c86a849280ee3f647fff139b8f42db781310dac2707a4e313f5e25d9cd126521"),
    "forget before": (0, "66c2024b23eb0ecc7b48718efad7164870836526fd5d3e51f316b9e2611c8b4f"),
}


def bench_merge() -> ModuleType:
    """bench/bench_merge.py, whose ``make_entries`` builds the realistic entries."""
    spec = importlib.util.spec_from_file_location("bench_merge_entries",
                                                  ROOT / "bench" / "bench_merge.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outputs(tmp: Path) -> dict[str, tuple[int, str]]:
    """Each command's exit status and output (the folder written as ``TMP``), and the
    files written."""
    make = bench_merge().make_entries
    a, b, c = tmp / "a.json", tmp / "b.json", tmp / "c.json"
    artifacts.write_cache(a, MeasureCache(make(10_000, seed=1, host="runner-a")))
    artifacts.write_cache(b, MeasureCache(make(10_000, seed=2, host="runner-b", start=7_500)))
    # the same runner's code: some keys' clear picks disagree
    artifacts.write_cache(c, MeasureCache(make(10_000, seed=3, host="runner-a", start=5_000)))

    def run(*argv: object) -> tuple[int, str]:
        out = io.StringIO()
        code = main([str(x) for x in argv], out=out)
        return code, out.getvalue().replace(str(tmp), "TMP")

    def text(path: Path) -> tuple[int, str]:
        return 0, path.read_text()

    merged, conflicted, forgotten = tmp / "m.json", tmp / "m2.json", tmp / "f.json"
    shutil.copy(a, forgotten)
    return {
        "file a": text(a),
        "show": run("show", a), "show --wide": run("show", "--wide", a),
        "show --json": run("show", "--json", a),
        "show --device --op": run("show", "--device", "sm_90", "--op", "softmax", a),
        "diff a b": run("diff", a, b), "diff b a": run("diff", b, a),
        "merge": run("merge", "-o", merged, a, b), "merged file": text(merged),
        "merge conflicts": run("merge", "--fail-on-conflict", "-o", conflicted, a, c),
        "merged conflicts file": text(conflicted),
        "forget dry": run("forget", "--candidate", "wmma_gemm", "--dry-run", forgotten),
        "forget": run("forget", "--op", "softmax", "--device", "sm_90", forgotten),
        "forgotten file": text(forgotten),
        "forget before": run("forget", "--before", "2026-12-03T02:00:00Z", "--dry-run",
                             forgotten),
    }


@pytest.mark.slow
def test_the_commands_print_and_write_what_they_did(tmp_path: Path) -> None:
    got = {name: (code, hashlib.sha256(text.encode()).hexdigest())
           for name, (code, text) in outputs(tmp_path).items()}
    assert got == DIGESTS
