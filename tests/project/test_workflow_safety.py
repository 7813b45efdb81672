"""docs/ci/workflow.yml is safe to copy into a repository with self-hosted GPU runners:
pytest-arbiter comes from a pinned, hash-checked wheel (never a bare name on an index),
no checkout keeps its credentials, only the job that opens the corpus pull request may
write and only on a push, the corpus is merged only after the fleet gate passed, pip
caches its downloads, and a scheduled job rechecks the cached winners on the GPUs."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.factories import ROOT

yaml = pytest.importorskip("yaml")

WORKFLOW = ROOT / "docs" / "ci" / "workflow.yml"


def _workflow() -> dict[str, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def _steps() -> list[tuple[str, dict[str, Any]]]:
    return [(name, step) for name, job in _workflow()["jobs"].items()
            for step in job["steps"]]


def _install_steps() -> list[tuple[str, str]]:
    return [(job, step["run"]) for job, step in _steps()
            if "run" in step and "pip install" in step["run"]]


def test_pytest_arbiter_comes_from_a_pinned_wheel_checked_by_its_hash() -> None:
    env = _workflow()["env"]
    assert "ARBITER" not in env, "a bare package name is installed from the index"
    assert {"ARBITER_WHEEL", "ARBITER_SHA256"} <= set(env)
    jobs = {job for job, _ in _install_steps()}
    assert jobs == {"cpu", "gpu", "gate", "merge", "recheck"}
    for job, script in _install_steps():
        check = script.index("sha256sum --check")
        install = script.index("pip install")
        assert check < install, job
        # what pip installs: the checked wheel (with an extra) and the user's project only
        line = script[install:].split("pip install", 1)[1].split("\n")[0]
        words = line.replace("${{ matrix.extra }}", "EXTRA").split()
        assert words[0].startswith('"$wheel'), (job, words)
        assert set(words[1:]) <= {"."}, (job, words)


def _run_install(tmp_path: Path, wheel_bytes: bytes, sha: str) -> tuple[int, str, Path]:
    """The gpu job's install step, with ``python`` recording its arguments."""
    script = dict(_install_steps())["gpu"].replace("${{ matrix.extra }}", "cuda12")
    repo = tmp_path / "repo"
    (repo / "wheels").mkdir(parents=True)
    wheel = repo / "wheels" / "pytest_arbiter-0.1.0-py3-none-any.whl"
    wheel.write_bytes(wheel_bytes)
    tools = tmp_path / "tools"
    tools.mkdir()
    record = tmp_path / "pip-args"
    python = tools / "python"
    python.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{record}"\n')
    python.chmod(0o755)
    temp = tmp_path / "runner-temp"
    temp.mkdir()
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
           "RUNNER_TEMP": str(temp), "ARBITER_SHA256": sha,
           "ARBITER_WHEEL": "wheels/pytest_arbiter-0.1.0-py3-none-any.whl"}
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr, record


def test_the_install_step_installs_the_wheel_whose_hash_matches(tmp_path: Path) -> None:
    body = b"PK\x03\x04 a wheel"
    code, output, record = _run_install(tmp_path, body, hashlib.sha256(body).hexdigest())
    assert code == 0, output
    args = record.read_text().split()
    assert args[:3] == ["-m", "pip", "install"]
    assert args[3].endswith("/pytest_arbiter-0.1.0-py3-none-any.whl[cuda12]")
    assert args[4:] == ["."]


@pytest.mark.parametrize("sha", ["", "0" * 64])
def test_a_wheel_that_does_not_match_its_hash_is_never_installed(tmp_path: Path,
                                                                 sha: str) -> None:
    code, output, record = _run_install(tmp_path, b"PK\x03\x04 tampered", sha)
    assert code != 0
    assert not record.exists(), "pip ran"
    assert ("ARBITER_SHA256" in output) if not sha else ("FAILED" in output), output


def test_no_checkout_keeps_its_credentials() -> None:
    checkouts = [(job, step) for job, step in _steps()
                 if step.get("uses", "").startswith("actions/checkout@")]
    assert len(checkouts) == 6
    for job, step in checkouts:
        assert step.get("with", {}).get("persist-credentials") is False, job


def test_only_the_pull_request_job_may_write_and_only_on_a_push() -> None:
    data = _workflow()
    assert data["permissions"] == {"contents": "read"}
    writers = {name: job for name, job in data["jobs"].items()
               if "write" in str(job.get("permissions", {}))}
    assert set(writers) == {"corpus-pr"}
    job = writers["corpus-pr"]
    assert job["permissions"] == {"contents": "write", "pull-requests": "write"}
    assert "github.event_name == 'push'" in job["if"]
    # it runs no step of the repository's code: the pinned action and a copy only
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs and all(run.startswith("cp ") for run in runs), runs


def test_the_corpus_is_merged_only_after_the_fleet_gate_passed() -> None:
    merge = _workflow()["jobs"]["merge"]
    assert "gate" in merge["needs"]
    assert "needs.gate.result == 'success'" in " ".join(merge["if"].split())


def test_every_python_setup_caches_pip() -> None:
    setups = [(job, step) for job, step in _steps()
              if step.get("uses", "").startswith("actions/setup-python@")]
    assert len(setups) == 5
    for job, step in setups:
        assert step["with"].get("cache") == "pip", job


def test_a_scheduled_job_rechecks_the_winners_on_every_gpu() -> None:
    data = _workflow()
    triggers = data.get("on", data.get(True))
    assert triggers["schedule"] and re.fullmatch(r"[\d*/ ,-]+", triggers["schedule"][0]["cron"])
    jobs = data["jobs"]
    recheck = jobs["recheck"]
    assert recheck["strategy"] == jobs["gpu"]["strategy"]
    assert "schedule" in recheck["if"]
    script = " ".join(step.get("run", "") for step in recheck["steps"])
    assert "--arbiter-recheck=fail" in script and "--arbiter-tune" not in script
    # the tuning jobs do not run on the schedule: it is the recheck's
    for name in ("cpu", "gpu", "gate"):
        assert "github.event_name != 'schedule'" in jobs[name]["if"], name
