"""``pytest-arbiter report --history``: a corpus committed several times (and renamed
once) in a real git repository made here; the page shows each key's winner and median
per commit, marks the winner change and the slowdown in words, and escapes the
commits' and the corpus's text."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_arbiter.cli.main import main
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import CacheEntry, MeasureCache, RankedCandidate
from pytest_arbiter.timing.measure import LatencyStats
from tests.browser import chromium_page, needs_chromium
from tests.cli.test_report_page import OVERFLOW, SMALL_TEXT

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

HOSTILE = "<img src=x onerror=alert(1)>"


def entry(bucket: str, *timed: tuple[str, float], device: str = "sm_90") -> CacheEntry:
    ranking = tuple(RankedCandidate(name, LatencyStats(m, m * 0.9, m * 0.95, m * 1.05,
                                                       m * 1.2, 25)) for name, m in timed)
    return CacheEntry(device, "nvidia", "matmul", bucket, "float16", ranking, 0.999, False,
                      {}, {"host": "h1", "measured_at": "2026-12-03T06:00:00Z"}, {})


def git(repo: Path, *args: str) -> str:
    env = {**{k: v for k, v in os.environ.items() if k not in ("GIT_DIR", "GIT_INDEX_FILE",
                                                               "GIT_WORK_TREE")},
           "GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.org",
           "GIT_COMMITTER_NAME": "Ada", "GIT_COMMITTER_EMAIL": "ada@example.org",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def commit(repo: Path, name: str, message: str, *entries: CacheEntry) -> None:
    artifacts.write_cache(repo / name, MeasureCache(entries))
    git(repo, "add", name)
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """Four commits: the corpus measured; wmma 30% slower; renamed; cublas wins 64^3
    and a key is added. Then an uncommitted change: the 128^3 key removed."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "corpus.json", "first tuning run",
           entry("64x64x64", ("wmma", 1000.0), ("cublas", 1500.0)),
           entry("128x128x128", ("cublas", 5000.0), ("wmma", 6000.0)))
    commit(repo, "corpus.json", f"slower driver {HOSTILE}",
           entry("64x64x64", ("wmma", 1300.0), ("cublas", 1500.0)),
           entry("128x128x128", ("cublas", 5000.0), ("wmma", 6000.0)))
    git(repo, "mv", "corpus.json", "arbiter-cache.json")
    git(repo, "commit", "-q", "-m", "rename the corpus")
    commit(repo, "arbiter-cache.json", "new cublas",
           entry("64x64x64", ("cublas", 1100.0), ("wmma", 1300.0)),
           entry("128x128x128", ("cublas", 5000.0), ("wmma", 6000.0)),
           entry("32x32x32", (HOSTILE, 400.0)))
    artifacts.write_cache(repo / "arbiter-cache.json", MeasureCache([
        entry("64x64x64", ("cublas", 1100.0), ("wmma", 1300.0)),
        entry("32x32x32", (HOSTILE, 400.0))]))
    return repo


def history(repo: Path, *extra: str) -> tuple[int, str, str]:
    pytest.importorskip("matplotlib")
    page = repo.parent / "history.html"
    out = io.StringIO()
    code = main(["report", "--history", str(repo / "arbiter-cache.json"), *extra,
                 "-o", str(page)], out=out)
    return code, out.getvalue(), page.read_text(encoding="utf-8") if page.exists() else ""


def test_each_key_across_the_commits_with_changes_marked(repo: Path) -> None:
    code, said, html = history(repo)
    assert code == 0, said
    assert "5 versions" in said and "3 winner changes, slowdowns and removals" in said
    versions = html[html.index('id="versions"'):html.index('id="changes"')]
    for subject in ("first tuning run", "rename the corpus", "new cublas", "not committed"):
        assert subject in versions  # the rename is followed: the first commits are there
    # a key may wrap between its parts (<wbr>)
    changes = html[html.index('id="changes"'):html.index('class="group"')].replace("<wbr>", "")
    assert re.search(r'<td class="mark">slower: 1.00 \u00b5s to 1.30 \u00b5s \(\+30%\)</td>'
                     r"<td>sm_90/nvidia/matmul/64x64x64/float16</td><td>\w+</td>", changes)
    assert ("new winner: wmma (1.30 \u00b5s) to cublas (1.10 \u00b5s)" in changes)
    assert "removed from the corpus" in changes  # 128^3, in the working tree
    group = html[html.index('class="group"'):]
    assert group.count('<figure class="trend"><svg') == 1
    # one row per key, one cell per version, oldest first
    row = re.search(r"<tr><td>64x64x64</td><td>float16</td>(.*?)</tr>", group)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert [c.split("<br>")[0] for c in cells] == ["wmma", "wmma", "wmma", "cublas",
                                                   "cublas"]
    assert "slower" in cells[1] and "new winner" in cells[3]


def test_commit_text_and_names_are_escaped(repo: Path) -> None:
    _, _, html = history(repo)
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<script" not in html


def test_max_commits_keeps_the_newest(repo: Path) -> None:
    code, said, html = history(repo, "--max-commits", "2")
    assert code == 0 and "3 versions" in said
    assert "first tuning run" not in html and "new cublas" in html


def test_outside_git_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    artifacts.write_cache(tmp_path / "arbiter-cache.json",
                          MeasureCache([entry("64x64x64", ("wmma", 1000.0))]))
    code, _, html = history(tmp_path)
    assert code == 2 and html == ""
    assert "pytest-arbiter report: error: git log" in capsys.readouterr().err


def test_history_takes_no_reports(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = history(repo, str(repo / "arbiter-cache.json"))
    assert code == 2 and "give no REPORT files" in capsys.readouterr().err


@needs_chromium
@pytest.mark.slow
def test_the_history_page_in_chromium_at_phone_width(repo: Path) -> None:
    code, said, _ = history(repo)
    assert code == 0, said
    with chromium_page(390, 844) as page:
        page.goto((repo.parent / "history.html").as_uri())
        assert "new winner: wmma" in page.locator("#changes").inner_text()
        assert page.locator("figure.trend svg").is_visible()
        page.screenshot(path=str(repo.parent / "history-phone.png"), full_page=True)
        width = page.evaluate("document.scrollingElement.scrollWidth")
        assert width <= page.evaluate("document.scrollingElement.clientWidth"), width
        assert page.evaluate(OVERFLOW) == [] and page.evaluate(SMALL_TEXT) == []


def test_the_chart_legend_keeps_each_keys_dtype() -> None:
    """Two keys of one long bucket, float32 and float64: the legend wraps them, so
    neither loses its dtype and they never read alike."""
    from pytest_arbiter.cli.report_history_chart import chart_svg

    for bucket in ("512x256x256x512x512/a16.16.16.16.16",
                   "b4096x4096x128,s2048x2048x64,h32x32,w1024x1024,q8x8x8x8x8x8,r16x16x16,"
                   "t32x32x32x32"):  # past four lines of the legend
        lines = {f"{bucket} float32": [(1000.0, False), (1200.0, True)],
                 f"{bucket} float64": [(2000.0, False), (2100.0, False)]}
        svg = chart_svg(lines, ["v1", "v2"], "t")
        assert "float32" in svg and "float64" in svg


@pytest.mark.parametrize("values", [[1.11, 1.2, 4.4], [2.3, 10.5], [7.0, 7.0], [0.004, 3e6]])
def test_a_history_chart_labels_below_and_above_every_line(values: list[float]) -> None:
    """Medians of 1.11 and 1.2 us once lay under the lowest label (1.5): the log axis
    now runs from a label at or below the lowest median to one at or above the highest,
    with three labels at least."""
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    from matplotlib import pyplot as plt

    from pytest_arbiter.cli.report_history_chart import _log_axis

    fig, ax = plt.subplots()
    ax.plot(range(len(values)), values)
    _log_axis(ax, values)
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    plt.close(fig)
    assert min(ticks) <= min(values) and max(ticks) >= max(values), ticks
    assert len(ticks) >= 2
