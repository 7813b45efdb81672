"""``pytest-arbiter report``: the page's content, its escaping of hostile names, the
message without matplotlib, and the page in a real headless browser (Debian's
chromium): it loads with no console message, shows its heat maps and tables, and a
screenshot is taken."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.gating import histogram_file
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, MeasureCache
from tests.browser import CHROMIUM
from tests.factories import ranked_entry

HOSTILE = "<script>alert(1)</script>\x1b[31m"
CONSIDERED = {"wmma": {"fingerprint": "3f9d0c2a71b4e865", "outcome": "timed"}}


def entry(device: str, op: str, bucket: str, dtype: str, *timed: tuple[str, float],
          reverify: bool = False, considered: bool = True) -> CacheEntry:
    names, medians = zip(*timed, strict=True)
    return ranked_entry(bucket, *names, medians=medians, device=device, op=op, dtype=dtype,
                        considered=CONSIDERED if considered else None, reverify=reverify)


def corpus(path: Path) -> Path:
    artifacts.write_cache(path, MeasureCache([
        entry("sm_90", "matmul", "64x64x64", "float16", ("wmma", 1000.0),
              ("cublas", 1500.0), ("naive", 4000.0)),
        entry("sm_90", "matmul", "64x64x64", "float32", ("cublas", 1000.0),
              (HOSTILE, 1250.0)),
        entry("sm_90", "matmul", "24x16x32", "float16", ("cublas", 900.0)),
        entry("sm_90", "softmax", "64x128/c", "float32", ("fused_softmax", 500.0),
              ("cupy_softmax", 800.0), reverify=True),
        entry(f"gfx1151{HOSTILE}", "matmul", "128x128x128", "bfloat16",
              ("hipblas", 2000.0), ("tiled", 2600.0), considered=False),
    ]))
    return path


def histogram(path: Path) -> Path:
    histogram_file.write_histogram(path, {
        ("nvidia", "matmul", "wmma", "won"): 10,
        ("nvidia", "matmul", "wmma", "degraded"): 3,
        ("nvidia", "softmax", HOSTILE, "error"): 1,
    })
    return path


def report(tmp_path: Path) -> tuple[Path, str]:
    pytest.importorskip("matplotlib")
    page = tmp_path / "report.html"
    out = io.StringIO()
    code = main(["report", str(corpus(tmp_path / "c.json")),
                 str(histogram(tmp_path / "h.json")), "-o", str(page)], out=out)
    assert code == 0, out.getvalue()
    assert out.getvalue().startswith(f"{page}: 5 entries, 1 report (JUnit or histogram)")
    return page, page.read_text()


def test_the_page_has_heat_maps_tables_and_the_problems(tmp_path: Path) -> None:
    _, text = report(tmp_path)
    # one figure and one table per device and op
    assert text.count('<figure class="heatmap"><svg') == 3
    assert text.count('<table class="entries">') == 3
    problems = text[text.index('id="problems"'):text.index('id="due"')]
    assert "degraded" in problems and "error" in problems and "won" not in problems
    due = text[text.index('id="due"'):text.index('class="group"')]
    assert "fused_softmax" in due and "reverify" in due and "hipblas" in due
    assert "wmma" not in due  # measured against known code, in an unchanged environment
    # the winner on hover, with both speedups in the tables
    assert re.search(r"<title>64x64x64 float16: wmma \(speedup over the runner-up: 1\.50x",
                     text)
    assert "<title>24x16x32 float16: cublas (speedup over the runner-up: timed alone" in text
    assert '<td class="num">4.00x</td>' in text  # wmma over the slowest (naive)


def test_every_artifact_string_is_escaped(tmp_path: Path) -> None:
    _, text = report(tmp_path)
    assert "<script" not in text and "\x1b" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\x1b[31m" in text
    # nothing is loaded from anywhere (url(#id) and href="#id" point inside the page; the
    # colour bar is a data: image)
    assert not re.search(r"""src\s*=|href\s*=\s*"(?!#|data:)|<link|@import|url\((?!#)""",
                         text)
    ids = re.findall(r' id="([^"]+)"', text)
    assert len(ids) == len(set(ids)), "an id twice on one page"


def test_without_matplotlib_it_says_what_to_install(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    page = tmp_path / "r.html"
    code = main(["report", str(corpus(tmp_path / "c.json")), "-o", str(page)],
                out=io.StringIO())
    assert code == 2
    assert "pip install 'pytest-arbiter[report]'" in capsys.readouterr().err
    assert not page.exists()


# -- in a real browser --------------------------------------------------------------------



def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
         "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", *args, page.as_uri()],
        capture_output=True, text=True, timeout=120)


def console_messages(stderr: str) -> list[str]:
    """What the page said on its console (chromium logs each message, warnings and
    errors alike, as a ``CONSOLE`` line), and uncaught errors."""
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (CI installs it: "
                    "apt-get install chromium)")
@pytest.mark.slow
def test_the_page_in_a_headless_browser(tmp_path: Path) -> None:
    # the check itself: a page that logs an error is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom')</script>")
    assert console_messages(chromium(bad, tmp_path / "p0", "--dump-dom").stderr)

    page, _ = report(tmp_path)
    done = chromium(page, tmp_path / "p1", "--dump-dom")
    assert done.returncode == 0, done.stderr
    assert console_messages(done.stderr) == []
    dom = done.stdout
    assert dom.count("<svg") == 3 and dom.count('<table class="entries">') == 3
    assert 'id="problems"' in dom and 'id="due"' in dom
    assert "<script" not in dom

    shot = tmp_path / "report.png"
    done = chromium(page, tmp_path / "p2", "--hide-scrollbars", "--window-size=1280,2400",
                    f"--screenshot={shot}")
    assert done.returncode == 0, done.stderr
    assert console_messages(done.stderr) == []
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
