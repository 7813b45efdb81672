"""docs/ci/workflow.yml (the workflow a user copies) and ci/gpu-check.yml (this
project's own GPU check): they parse, and every pytest-arbiter command and --arbiter-*
option they use exists in this package (so a copied workflow cannot call something we
dropped)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from pytest_arbiter.cli.main import build_parser
from pytest_arbiter.session.settings import OPTIONS
from tests.factories import ROOT

yaml = pytest.importorskip("yaml")

WORKFLOW = ROOT / "docs" / "ci" / "workflow.yml"
GPU_CHECK = ROOT / "ci" / "gpu-check.yml"
SHA_PIN = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")


def _workflow(path: Path = WORKFLOW) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def _scripts(path: Path = WORKFLOW) -> list[tuple[str, str]]:
    """(job, run script) for every step that runs a command."""
    out = []
    for name, job in _workflow(path)["jobs"].items():
        for step in job["steps"]:
            if "run" in step:
                out.append((name, step["run"]))
    return out


def _commands(script: str) -> list[str]:
    """The shell commands of a step: continuations joined, one per line."""
    return [line.strip() for line in script.replace("\\\n", " ").splitlines() if line.strip()]


def _expand(word: str) -> str:
    return re.sub(r"\$\{\{[^}]*\}\}|\$\{[^}]*\}|\$[A-Z_]+", "X", word)


def test_workflow_has_the_three_kinds_of_job() -> None:
    data = _workflow()
    assert {"push", "pull_request"} <= set(data.get("on", data.get(True, {})))
    jobs = data["jobs"]
    assert jobs["cpu"]["runs-on"] == "ubuntu-latest"
    labels = [m["labels"] for m in jobs["gpu"]["strategy"]["matrix"]["include"]]
    assert all("self-hosted" in ls for ls in labels)
    assert {ls[-1] for ls in labels} == {"sm_120", "sm_90", "gfx1151"}
    assert set(jobs["merge"]["needs"]) == {"gpu", "gate"}
    assert set(jobs["gate"]["needs"]) == {"cpu", "gpu"}
    uploads = [s for s in jobs["gpu"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert {u["with"]["name"].split("-")[0] for u in uploads} == {"shard", "reports"}


def test_gpu_jobs_never_run_a_fork_pull_request() -> None:
    for path in (WORKFLOW, GPU_CHECK):
        for name, job in _workflow(path)["jobs"].items():
            if "matrix.labels" not in str(job["runs-on"]):
                continue
            condition = " ".join(str(job.get("if", "")).split())
            assert ("github.event.pull_request.head.repo.full_name == github.repository"
                    in condition), f"{path.name}: job {name} runs fork pull requests"


def test_actions_are_pinned_by_commit() -> None:
    for path in (WORKFLOW, GPU_CHECK):
        text = path.read_text()
        for job in _workflow(path)["jobs"].values():
            for step in job["steps"]:
                if "uses" in step:
                    assert SHA_PIN.match(step["uses"]), f"{path.name}: {step['uses']}"
                    # the tag rides along in a comment
                    line = next(ln for ln in text.splitlines() if step["uses"] in ln)
                    assert re.search(r"# v\d+\.\d+\.\d+$", line), line


def test_the_user_workflow_installs_the_users_project() -> None:
    scripts = "\n".join(script for _, script in _scripts())
    assert "-e ." not in scripts and "[test" not in scripts
    assert 'python -m pip install "$wheel[${{ matrix.extra }}]" .' in scripts
    assert "ci/gpu-check.sh" not in scripts
    assert "bash ci/gpu-check.sh" in GPU_CHECK.read_text()


def test_every_arbiter_option_used_exists() -> None:
    known = {spec.flag for spec in OPTIONS}
    used = {m for _, script in _scripts() for m in re.findall(r"--arbiter-[a-z-]+", script)}
    assert used >= {"--arbiter-tune", "--arbiter-cache", "--arbiter-histogram",
                    "--arbiter-baseline"}
    assert used <= known, f"options the plugin does not define: {sorted(used - known)}"


def test_every_cli_command_used_parses() -> None:
    parser = build_parser()
    seen = set()
    for job, script in _scripts():
        for line in _commands(script):
            if "pytest-arbiter " not in line:
                continue
            command = re.split(r";|&&|\|\|", line[line.index("pytest-arbiter "):])[0]
            argv = shlex.split(_expand(command))[1:]
            try:
                args = parser.parse_args(argv)
            except SystemExit:
                pytest.fail(f"job {job}: {command!r} does not parse")
            seen.add(args.command)
    assert seen == {"show", "merge", "diff", "gate", "stale"}


def test_scripts_the_workflows_call_are_in_the_repository() -> None:
    for _, script in _scripts(GPU_CHECK):
        for path in re.findall(r"bash (\S+\.sh)", script):
            assert (ROOT / path).is_file(), f"{path} is missing"
