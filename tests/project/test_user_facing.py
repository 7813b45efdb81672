"""Small things a user trips on (issue 29, point 6): ``python -m pytest_arbiter`` is the
console script; the README's links work where the README is read from the sdist (and
are absolute once ``[project.urls]`` names the repository); the README's production
snippet dispatches a shape its quick start tuned; ``-p no:arbiter`` is documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_arbiter import __version__
from tests.factories import ROOT

README = (ROOT / "README.md").read_text()


def test_python_m_pytest_arbiter_is_the_console_script(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest_arbiter", "--version"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pytest-arbiter {__version__}"
    missing = subprocess.run([sys.executable, "-m", "pytest_arbiter", "show",
                              str(tmp_path / "none.json")], capture_output=True, text=True,
                             timeout=60, check=False)
    assert missing.returncode == 2 and "none.json" in missing.stderr


def _sdist_carries(path: str) -> bool:
    """Whether MANIFEST.in's include and graft lines take ``path`` into the sdist."""
    for line in (ROOT / "MANIFEST.in").read_text().splitlines():
        words = line.split()
        if not words or words[0] not in ("include", "graft"):
            continue
        for pattern in words[1:]:
            if path == pattern or path.startswith(pattern.rstrip("/") + "/"):
                return True
    return path.startswith("pytest_arbiter/")


def test_readme_points_only_at_what_its_reader_has() -> None:
    """Links resolve in the sdist (absolute once ``[project.urls]`` is set); commands
    name files the sdist carries, or say they need a checkout."""
    urls = re.search(r"^\[project\.urls\]", (ROOT / "pyproject.toml").read_text(), re.M)
    links = re.findall(r"\]\(([^)\s]+)\)", README)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        assert not urls, f"{link}: [project.urls] is set, so links must be absolute"
        path = link.split("#")[0]
        assert (ROOT / path).exists(), link
        assert _sdist_carries(path), f"{link}: the sdist does not carry it"
    for found in re.finditer(r"`bash (\S+)`", README):
        path = found.group(1)
        before = README[max(0, found.start() - 120):found.start()]
        assert _sdist_carries(path) or "checkout" in before, path
    assert "-p no:arbiter" in README


def _shapes(text: str) -> list[tuple[int, ...]]:
    return [tuple(int(n) for n in m.split(",")) for m in
            re.findall(r"np\.ones\(\((\d+,\s*\d+)\)", text)]


def test_the_production_snippet_dispatches_a_shape_the_quick_start_tuned() -> None:
    start = README.index("def test_project():")
    tests = README[start:README.index("PY\n", start)]
    production = README[README.index("PYTEST_ARBITER_CACHE=arbiter-cache.json python"):]
    production = production[:production.index('dispatch_histogram())"')]
    tuned = set(_shapes(tests))
    used = _shapes(production)
    assert used and set(used) <= tuned, (used, tuned)


@pytest.mark.parametrize("line", ["'./pytest_arbiter-0.1.0-py3-none-any.whl[cuda12]'",
                                  "toolkit"])
def test_gpu_docs_install_lines_are_quoted_and_say_what_a_runner_needs(line: str) -> None:
    text = (ROOT / "docs" / "gpu.md").read_text()
    assert line in text
    assert not re.search(r"pip install pytest-arbiter\[", text)
