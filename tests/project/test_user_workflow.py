"""docs/ci/workflow.yml, run: its shell steps in job order against a small user project,
on the CPU lane. Each GPU matrix row is a separate "runner" (its own copy of the
repository, its own processes, its own cache shard and JUnit report); uploads and
downloads of artifacts go through a folder; then the merge job and the gate job.

Steps that only GitHub can run are not run: checkout (each runner gets a fresh copy),
set-up-python, the venv and the installs (the test's interpreter already has the user's
project and this checkout of pytest-arbiter on its path), and the pull request.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.store import artifacts
from tests.factories import ROOT

yaml = pytest.importorskip("yaml")

WORKFLOW = ROOT / "docs" / "ci" / "workflow.yml"
EVENT = "push"
NOT_RUN = ("checkout", "set up Python", "create a venv", "install",
           "open or update the corpus pull request")

MYLIB = '''
"""A user's kernel library: a fast aligned matmul, and a scale kernel that may decline."""
import os

import numpy as np
import pytest_arbiter

pytest_arbiter.op("mylib_scale", reference=lambda x: x * 2)


def _aligned(a, b):
    return a.shape[0] % 16 == 0 and b.shape[1] % 8 == 0 and a.shape[1] % 16 == 0


@pytest_arbiter.candidate("matmul", target="cpu", name="mylib_aligned_matmul", tier=5,
                          accepts=_aligned, align=(16, 8, 16))
def aligned_matmul(a, b):
    return np.dot(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)


@pytest_arbiter.candidate("mylib_scale", target="cpu", name="mylib_fast_scale")
def fast_scale(x):
    if os.environ.get("SAMPLE_DEGRADE") == "1":
        raise pytest_arbiter.Decline("this runner's build has no fast path")
    return x * 2


def project(a, b):
    return pytest_arbiter.dispatch("matmul", a, b)


def scale(x):
    return pytest_arbiter.dispatch("mylib_scale", x)
'''

MYLIB_TESTS = '''
import os

import numpy as np

import mylib

N = int(os.environ.get("SAMPLE_N", "16"))


def test_project():
    a = np.ones((N, N), np.float32)
    np.testing.assert_allclose(mylib.project(a, a), np.full((N, N), float(N)))


def test_scale():
    np.testing.assert_allclose(mylib.scale(np.ones(8)), np.full(8, 2.0))
'''


@dataclass
class Fleet:
    """One workflow run: the artifacts store and what each step returned."""

    root: Path
    runner_env: dict[str, dict[str, str]]
    codes: dict[str, int] = field(default_factory=dict)
    output: dict[str, str] = field(default_factory=dict)

    @property
    def store(self) -> Path:
        return self.root / "artifact-store"


def _repository(path: Path) -> Path:
    path.mkdir()
    (path / "mylib.py").write_text(MYLIB)
    (path / "tests").mkdir()
    (path / "tests" / "test_mylib.py").write_text(MYLIB_TESTS)
    (path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    return path


def _tools(folder: Path) -> Path:
    """``python`` and ``pytest-arbiter`` as the test's interpreter runs them."""
    folder.mkdir()
    for name, argv in (("python", ""), ("pytest-arbiter", " -m pytest_arbiter.cli.main")):
        tool = folder / name
        tool.write_text(f'#!/bin/sh\nexec "{sys.executable}"{argv} "$@"\n')
        tool.chmod(0o755)
    return folder


def _expression(expr: str, ctx: dict[str, str]) -> str:
    name = expr.strip()
    if name not in ctx:
        raise AssertionError(f"the test does not know the expression ${{{{ {name} }}}}")
    return ctx[name]


def _substitute(text: str, ctx: dict[str, str]) -> str:
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: _expression(m.group(1), ctx), text)


def _condition(cond: Any, failed: bool, needs: dict[str, str]) -> bool:
    """A step's or job's ``if:`` for a push event (GitHub's implicit ``success()``
    unless the condition says otherwise)."""
    if cond is None:
        return not failed
    text = str(cond).strip()
    text = text[3:-2] if text.startswith("${{") else text
    guarded = "cancelled()" in text or "always()" in text
    for github, python in (
            ("!cancelled()", "True"), ("always()", "True"),
            ("github.event.pull_request.head.repo.full_name", "''"),
            ("github.event_name", repr(EVENT)), ("github.repository", "'me/repo'"),
            *((f"needs.{job}.result", repr(result)) for job, result in needs.items()),
            ("&&", " and "), ("||", " or ")):
        text = text.replace(github, python)
    value = bool(eval(" ".join(text.split()), {"__builtins__": {}}))
    return value and (guarded or not failed)


def _upload(step: dict[str, Any], workspace: Path, fleet: Fleet, ctx: dict[str, str]) -> None:
    name = _substitute(step["with"]["name"], ctx)
    source = workspace / _substitute(step["with"]["path"], ctx)
    target = fleet.store / name
    assert not target.exists(), f"two uploads named {name}"
    if source.is_dir():
        shutil.copytree(source, target)
    elif source.is_file():
        target.mkdir(parents=True)
        shutil.copy2(source, target)
    else:
        assert step["with"].get("if-no-files-found") != "error", f"{source} is missing"


def _download(step: dict[str, Any], workspace: Path, fleet: Fleet,
              ctx: dict[str, str]) -> None:
    into = workspace / _substitute(step["with"]["path"], ctx)
    if "name" in step["with"]:  # one artifact, extracted into the path itself
        shutil.copytree(fleet.store / _substitute(step["with"]["name"], ctx), into,
                        dirs_exist_ok=True)
        return
    for found in sorted(fleet.store.glob(step["with"]["pattern"])):
        shutil.copytree(found, into / found.name)


def _run_job(fleet: Fleet, job_name: str, job: dict[str, Any], label: str,
             matrix: dict[str, Any], workflow_env: dict[str, str], repo: Path,
             tools: Path) -> bool:
    """Run one job (one matrix row); True when it succeeded."""
    workspace = fleet.root / "runners" / label
    shutil.copytree(repo, workspace)
    temp = fleet.root / "temp" / label
    temp.mkdir(parents=True)
    ctx = {f"matrix.{k}": str(v) for k, v in matrix.items()}
    ctx.update({f"env.{k}": v for k, v in workflow_env.items()})
    ctx.update({"github.run_id": "4242", "runner.temp": str(temp)})
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "COV_")) and k != "PYTHONPATH"}
    env.update(workflow_env)
    env.update({k: _substitute(str(v), ctx) for k, v in job.get("env", {}).items()})
    env.update(fleet.runner_env.get(label, {}))
    env.update({"PATH": f"{tools}{os.pathsep}{env['PATH']}", "RUNNER_TEMP": str(temp),
                "GITHUB_PATH": str(temp / "github_path"), "PYTHONPATH": f"{ROOT}",
                "PYTHONDONTWRITEBYTECODE": "1"})
    failed = False
    for step in job["steps"]:
        name = step.get("name", step.get("uses", ""))
        if not _condition(step.get("if"), failed, {}):
            continue
        uses = step.get("uses", "")
        if "upload-artifact" in uses:
            _upload(step, workspace, fleet, ctx)
            continue
        if "download-artifact" in uses:
            _download(step, workspace, fleet, ctx)
            continue
        if name.startswith(NOT_RUN):
            continue
        assert "run" in step, f"job {job_name}: step {name!r} is neither run nor skipped"
        script = _substitute(step["run"], ctx)
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               script], cwd=workspace, env=env, capture_output=True,
                              text=True, timeout=300)
        key = f"{label}: {name}"
        fleet.codes[key] = done.returncode
        fleet.output[key] = done.stdout + done.stderr
        failed = failed or done.returncode != 0
    return not failed


def run_workflow(tmp_path: Path, runner_env: dict[str, dict[str, str]]) -> Fleet:
    data = yaml.safe_load(WORKFLOW.read_text())
    workflow_env = {k: str(v) for k, v in data["env"].items()}
    fleet = Fleet(tmp_path, runner_env)
    fleet.store.mkdir()
    repo = _repository(tmp_path / "repo")
    tools = _tools(tmp_path / "tools")
    results: dict[str, str] = {}
    for job_name, job in data["jobs"].items():  # the file's order is the needs order
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        assert all(n in results for n in needs), f"job {job_name} runs before its needs"
        known = {n: results[n] for n in needs}
        if not _condition(job.get("if"), any(known[n] != "success" for n in needs), known):
            results[job_name] = "skipped"
            continue
        rows = job.get("strategy", {}).get("matrix", {}).get("include", [{}])
        ok = True
        for row in rows:
            label = f"{job_name}-{row['device']}" if "device" in row else job_name
            ok = _run_job(fleet, job_name, job, label, row, workflow_env, repo, tools) and ok
        results[job_name] = "success" if ok else "failure"
    return fleet


def _code(fleet: Fleet, label: str, step_start: str) -> int:
    found = [k for k in fleet.codes if k.startswith(f"{label}: {step_start}")]
    assert len(found) == 1, (label, step_start, sorted(fleet.codes))
    return fleet.codes[found[0]]


def _say(fleet: Fleet) -> str:
    return "\n".join(f"== {k} (exit {fleet.codes[k]})\n{v}" for k, v in fleet.output.items())


SHAPES = {"gpu-sm_120": {"SAMPLE_N": "16"}, "gpu-sm_90": {"SAMPLE_N": "32"},
          "gpu-gfx1151": {"SAMPLE_N": "64"}}


@pytest.mark.slow
def test_a_clean_fleet_merges_every_shard_and_passes(tmp_path: Path) -> None:
    fleet = run_workflow(tmp_path, SHAPES)
    log = _say(fleet)
    assert _code(fleet, "cpu", "tests") == 0, log
    for runner in SHAPES:
        assert _code(fleet, runner, "tune") == 0, log
        assert _code(fleet, runner, "what this runner measured") == 0, log
        assert (fleet.store / f"shard-{runner[4:]}" / f"{runner[4:]}.json").is_file()
        assert (fleet.store / f"reports-{runner[4:]}" / f"{runner[4:]}.xml").is_file()
    assert _code(fleet, "merge", "merge the shards") == 0, log
    corpus = artifacts.read_cache(fleet.store / "corpus" / "arbiter-cache.json")
    buckets = {e.bucket.split("/")[0] for e in corpus.entries() if e.op == "matmul"}
    # every runner's shape reached the corpus: the shards were merged, not overwritten
    assert {"16x16x16", "32x32x32", "64x64x64"} <= buckets, buckets
    assert {e.op for e in corpus.entries()} == {"matmul", "mylib_scale"}
    # what the pull request would say
    body = (fleet.store / "corpus" / "corpus-pr.md").read_text()
    assert body.count("matmul") >= 3
    # and what the merge said: its conflicts and its count
    assert "entries after merging 3 shard(s); 0 conflict(s)" in body, body
    assert _code(fleet, "gate", "gate every runner") == 0, log
    gate = fleet.output["gate: gate every runner's JUnit report"]
    assert "read 4 reports" in gate and "degrade gate passed" in gate, gate
    # the pull request job (on a push) gets the merged corpus in place
    assert _code(fleet, "corpus-pr", "put the merged corpus in place") == 0, log
    placed = tmp_path / "runners" / "corpus-pr" / "arbiter-cache.json"
    assert placed.read_bytes() == (fleet.store / "corpus" / "arbiter-cache.json").read_bytes()
    # the weekly recheck does not run on a push
    assert not [k for k in fleet.codes if k.startswith("recheck")], sorted(fleet.codes)


@pytest.mark.slow
def test_a_new_degrade_on_one_runner_fails_the_fleet_gate(tmp_path: Path) -> None:
    runners = {**SHAPES, "gpu-sm_90": {"SAMPLE_N": "32", "SAMPLE_DEGRADE": "1"}}
    fleet = run_workflow(tmp_path, runners)
    log = _say(fleet)
    assert _code(fleet, "gpu-sm_90", "tune") == 1, log
    # its shard and report are still uploaded, and the others are unaffected
    assert (fleet.store / "reports-sm_90" / "sm_90.xml").is_file()
    assert _code(fleet, "gpu-sm_120", "tune") == 0, log
    assert _code(fleet, "gate", "gate every runner") == 1, log
    # a fleet that failed the gate publishes no corpus and opens no pull request
    assert not [k for k in fleet.codes if k.startswith(("merge", "corpus-pr"))], log
    assert not (fleet.store / "corpus").exists()
    gate = fleet.output["gate: gate every runner's JUnit report"]
    assert ("NEW degraded: target=cpu op=mylib_scale candidate=mylib_fast_scale "
            "(1 dispatch) in tests/test_mylib.py::test_scale") in gate, gate
    assert "degrade gate FAILED" in gate
