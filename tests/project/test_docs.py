"""The docs, run: every shell block of README.md and docs/*.md executes in a temp folder.

The convention (for users too: docs/contract.md, "The commands in these docs are tested"):

* A fenced block whose info string starts with ``bash``, ``sh`` or ``shell`` is run as one
  script with ``bash -eo pipefail``; in a ``console`` block, the lines that start with
  ``$ `` are run and the others are output (not compared).
* A shell block that cannot run here (a GPU, a GitHub runner, an install from the
  network, a benchmark of minutes, the project's own suite) is marked on the line before
  its fence with ``<!-- docs-test: skip (the reason) -->``. The reason is required, and a
  skip mark anywhere else is an error, so nothing is left out silently.
* Each doc gets its own temp folder; its blocks run in order there, so a block uses
  what the ones before it wrote. ``SETUPS`` prepares the folder of a doc whose commands
  need a project (a sample kernel library and its tests, a corpus from a tune run).
* ``pip install -e ...`` lines become no-ops (``:``): this checkout is already on
  ``PYTHONPATH`` for every command, and the folder of the Python running the tests is
  first on ``PATH`` (``python`` is that Python, in a virtual environment or not). Other
  installs need the network: they are marked skip.
* Commands belong in fenced blocks: a line of an indented code block that starts with a
  command (``pip``, ``python``, ``pytest``, ``pytest-arbiter``, ``bash``) fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.factories import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]*)\)\s*-->")
MARK = re.compile(r"<!--\s*docs-test:")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
EDITABLE = re.compile(
    r"^(?P<indent>\s*)(?P<cmd>(?:python3? -m )?pip3? install\s+(?:-e|--editable)\b.*)$")
COMMAND = re.compile(r"^ {4,}(?:\$ )?(?:pip3?|python3?|pytest|pytest-arbiter|bash)(?:\s|$)")
BLOCK_TIMEOUT_S = 300


@dataclass
class Block:
    doc: Path
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    info: str
    text: str
    skip: str | None  # the reason, when marked skip

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path, text: str | None = None) -> list[Block]:
    """The fenced code blocks of ``doc`` (or of ``text``), with their skip marks."""
    if text is None:
        text = doc.read_text(encoding="utf-8")
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        fence = opened["fence"]
        info = opened["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = lines[j].strip()
            if closing.startswith(fence[0] * len(fence)) and not closing.strip(fence[0]):
                break
            body.append(lines[j][len(opened["indent"]):] if lines[j].startswith(
                opened["indent"]) else lines[j])
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = SKIP.search(lines[k]) if k >= 0 else None
        found.append(Block(doc, i + 1, j + 1, info, "\n".join(body) + "\n",
                           mark["reason"].strip() if mark else None))
        i = j + 1
    return found


def language(block: Block) -> str:
    return block.info.split()[0].lower() if block.info else ""


def script_of(block: Block) -> str:
    """The script a block runs: a console block's ``$`` lines, editable installs as no-ops."""
    lines = block.text.splitlines()
    if language(block) == "console":
        lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
    out = []
    for ln in lines:
        editable = EDITABLE.match(ln)
        if editable:
            ln = f"{editable['indent']}: # docs test, already installed: {editable['cmd']}"
        out.append(ln)
    return "\n".join(out) + "\n"


# -- the folders' set-up ------------------------------------------------------------

SAMPLE_LIBRARY = '''
"""A small kernel library: an aligned matmul candidate and a public entry point."""
import numpy as np
import pytest_arbiter


def aligned(a, b):
    return a.shape[0] % 16 == 0 and b.shape[1] % 8 == 0 and a.shape[1] % 16 == 0


@pytest_arbiter.candidate("matmul", target="cpu", tier=5, accepts=aligned,
                          align=(16, 8, 16))
def my_aligned_matmul(a, b):
    return np.dot(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)


def project(a, b):
    return pytest_arbiter.dispatch("matmul", a, b)
'''

SAMPLE_TESTS = '''
import numpy as np
import pytest

import mykernels


@pytest.mark.host_free
@pytest.mark.parametrize("m", [24, 32, 64])
def test_project(m):
    a = np.ones((m, 32), np.float32)
    b = np.ones((32, 16), np.float32)
    np.testing.assert_allclose(mykernels.project(a, b), a @ b)
'''


def sample_project(folder: Path) -> None:
    """A user's project: a kernel library calling ``pytest_arbiter.dispatch``, its tests."""
    (folder / "mykernels.py").write_text(textwrap.dedent(SAMPLE_LIBRARY).lstrip())
    (folder / "test_mykernels.py").write_text(textwrap.dedent(SAMPLE_TESTS).lstrip())


def git_project(folder: Path) -> None:
    """The sample project in a git repository (a doc's commands ``git add`` to it)."""
    sample_project(folder)
    run(["git", "init", "-q", "."], folder)


def tuned_project(folder: Path) -> None:
    """The sample project and ``corpus.json``, written by a tune run."""
    sample_project(folder)
    run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--arbiter-tune",
         "--arbiter-cache=corpus.json"], folder)


SETUPS: dict[str, Callable[[Path], None]] = {
    "docs/ci.md": git_project,
    "docs/recheck.md": tuned_project,
}


def environment(folder: Path) -> dict[str, str]:
    """The caller's environment less pytest's and the arbiter's variables; this checkout
    on the path; the running interpreter's folder first on ``PATH`` (its ``python`` and
    the ``pytest-arbiter`` script, as if its virtual environment were activated); temp
    files inside the doc's folder."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "COV_")) and k != "PYTHONPATH"}
    path = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
    env.update({"PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1",
                "TMPDIR": str(folder), "PATH": path})
    return env


def run(argv: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=folder, env=environment(folder), capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S)
    assert done.returncode == 0, f"set-up {argv}: {done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


# -- the tests ----------------------------------------------------------------------

def doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def test_every_doc_is_found() -> None:
    names = {doc_id(d) for d in DOCS}
    assert {"README.md", "docs/contract.md", "docs/how-it-decides.md"} <= names
    assert set(SETUPS) <= names


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_marks_and_fences(doc: Path) -> None:
    """Every skip mark has a reason and sits on a shell block; commands are fenced."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    marked = {b.line for b in blocks(doc) if b.skip is not None}
    problems = []
    for b in blocks(doc):
        if b.skip is not None and language(b) not in SHELL:
            problems.append(f"{b.where}: a skip mark on a {language(b) or 'plain'} block")
        if b.skip is not None and not b.skip:
            problems.append(f"{b.where}: a skip mark without a reason")
    fenced = {n for b in blocks(doc) for n in range(b.line, b.end + 1)}
    seen_marks = 0
    for number, line in enumerate(lines, 1):
        if number in fenced:
            continue
        if line.lstrip().startswith("<!--") and MARK.search(line):
            seen_marks += 1
            if not SKIP.search(line):
                problems.append(f"{doc_id(doc)}:{number}: not a docs-test mark: {line.strip()}")
        if COMMAND.match(line):
            problems.append(f"{doc_id(doc)}:{number}: a command in an indented block "
                            f"(fence it as bash): {line.strip()}")
    if seen_marks != len(marked):
        problems.append(f"{doc_id(doc)}: {seen_marks} docs-test marks, {len(marked)} on a "
                        "block (a mark must be on the line before a fence)")
    assert problems == []


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
@pytest.mark.slow
def test_shell_blocks_run(doc: Path, tmp_path: Path) -> None:
    """The doc's shell blocks, in order, in one temp folder: each exits 0."""
    shell = [b for b in blocks(doc) if language(b) in SHELL]
    runnable = [b for b in shell if b.skip is None]
    if not runnable:
        pytest.skip(f"no runnable shell block ({len(shell)} marked skip)")
    folder = tmp_path / "work"
    folder.mkdir()
    setup = SETUPS.get(doc_id(doc))
    if setup is not None:
        setup(folder)
    for block in runnable:
        script = script_of(block)
        try:
            done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                                   script], cwd=folder, env=environment(folder),
                                  capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"{block.where}: still running after {BLOCK_TIMEOUT_S} s\n{script}"
                        f"\n{exc.stdout!s:.3000}")
        assert done.returncode == 0, (
            f"{block.where}: exit {done.returncode}\n--- script\n{script}--- stdout\n"
            f"{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}")


def test_the_parser() -> None:
    """Fences, skip marks, console prompts and editable installs, on a small document."""
    text = textwrap.dedent("""\
        <!-- docs-test: skip (needs a GPU) -->
        ```bash
        nvidia-smi
        ```

        ````console
        $ pip install -e '.[test]'
        output line
        $ echo ok
        ````
        """)
    first, second = blocks(ROOT / "docs" / "sample.md", text)
    assert (first.skip, language(first), first.line) == ("needs a GPU", "bash", 2)
    assert second.skip is None
    assert script_of(second) == ("\n".join([
        ": # docs test, already installed: pip install -e '.[test]'", "echo ok"]) + "\n")


INTERNAL = re.compile(
    r"\bSPEC\b|design (?:notes?|card)|\bcommits? [0-9a-f]{7,40}\b|\bgit archive [0-9a-f]{7,40}\b"
    r"|\b(?:until|at|since) [0-9a-f]{7,40}\b|\bissue #?\d+\b|\bitem \d+\b")


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_no_internal_references(doc: Path) -> None:
    """A user's docs cite no design notes, commits or internal issue numbers."""
    found = [f"{doc_id(doc)}:{n}: {m.group(0)!r}"
             for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
             for m in INTERNAL.finditer(line)]
    assert found == []


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_relative_links_resolve(doc: Path) -> None:
    """Every relative link of a doc names a file of the repository (anchors not checked)."""
    text = doc.read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        if not (doc.parent / target).exists():
            missing.append(target)
    assert missing == []
