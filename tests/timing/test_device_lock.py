"""The per-device measurement lock: processes time one after the other, nesting is safe,
a lock that cannot be had never blocks the timing, and the entry says which it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from pytest_arbiter import MeasureCache, measured_arbitrate
from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.timing import device_lock
from pytest_arbiter.timing.device_lock import LOCK_DIR_ENV, lock_path, measurement_lock
from pytest_arbiter.timing.measure import ComparePolicy


@pytest.fixture(autouse=True)
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "locks"
    monkeypatch.setenv(LOCK_DIR_ENV, str(folder))
    return folder


HOLDER = """
import os, sys, time
from pytest_arbiter.timing.device_lock import measurement_lock
go, out = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.001)
with measurement_lock("cpu-test-device") as alone:
    start = time.monotonic_ns()
    time.sleep(0.3)
    end = time.monotonic_ns()
with open(out, "w") as fh:
    fh.write(f"{start} {end} {alone}")
"""


def test_two_processes_time_one_after_the_other(tmp_path: Path) -> None:
    go = tmp_path / "go"
    outs = [tmp_path / f"held-{i}" for i in range(2)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER, str(go), str(out)], env=env)
             for out in outs]
    go.touch()  # both reach for the lock at once
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    spans = []
    for out in outs:
        start, end, alone = out.read_text().split()
        assert alone == "True"
        spans.append((int(start), int(end)))
    first, second = sorted(spans)
    assert first[1] <= second[0], f"the holds overlapped: {spans}"


def test_nested_use_is_reentrant_and_another_thread_waits() -> None:
    seen: list[bool] = []
    with measurement_lock("sm_90") as outer, measurement_lock("sm_90", timeout_s=1) as inner:
        assert outer and inner
        thread = threading.Thread(target=lambda: seen.append(_held_now("sm_90", 0.05)))
        thread.start()
        thread.join()
    assert seen == [False]  # it timed out while this thread held it, and ran anyway
    with measurement_lock("sm_90", timeout_s=0) as again:
        assert again


def test_other_devices_do_not_wait() -> None:
    with measurement_lock("sm_90"):
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(_held_now("gfx1151", 0)))
        thread.start()
        thread.join()
    assert result == [True]


def _held_now(tag: str, timeout_s: float) -> bool:
    with measurement_lock(tag, timeout_s=timeout_s) as alone:
        return alone


def test_lock_files_have_safe_names_inside_the_folder(lock_dir: Path) -> None:
    tags = ["sm/90", "sm_90", "../../etc/passwd", "", "cpu-x86_64 AMD EPYC 7763", "é" * 200]
    paths = [lock_path(t) for t in tags]
    assert len(set(paths)) == len(tags)
    for path in paths:
        assert path.parent == lock_dir and len(path.name) < 100
        assert set(path.name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789._-")
    with measurement_lock("../../etc/passwd") as alone:
        assert alone and lock_dir.is_dir()


def test_an_unusable_lock_folder_times_anyway(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(LOCK_DIR_ENV, str(blocker / "locks"))
    ran = False
    with measurement_lock("sm_90") as alone:
        ran = True
    assert ran and alone is False


def test_a_measured_entry_records_that_it_was_timed_alone(lock_dir: Path) -> None:
    reg = CandidateRegistry()
    reg.add(FunctionCandidate(np.matmul, "library", "matmul", "cpu", 0, None, None))
    reg.add(FunctionCandidate(np.dot, "dot", "matmul", "cpu", 0, None, None))
    cache = MeasureCache()
    a = np.ones((16, 16), dtype="float32")
    measured_arbitrate("matmul", (a, a), reg.for_op("matmul"), cache,
                       policy=ComparePolicy(min_rounds=3, max_rounds=10, budget_s=0.005))
    entry = cache.entries()[0]
    assert entry.provenance.timed_alone is True
    assert json.loads(json.dumps(entry.to_dict()))["provenance"]["timed_alone"] is True
    assert lock_dir.is_dir()


def _other_process_holds(tag: str) -> bool:
    """Whether a fresh process gets ``tag``'s lock at once."""
    code = ("import sys\nfrom pytest_arbiter.timing.device_lock import measurement_lock\n"
            "with measurement_lock(sys.argv[1], timeout_s=0) as alone:\n"
            "    print(alone)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, tag], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    return done.stdout.strip() == "True"


def test_the_lock_file_stays_open_between_holds_and_still_excludes() -> None:
    with measurement_lock("cpu-reused") as first:
        fd = device_lock._LOCKS[str(lock_path("cpu-reused"))].fd
        assert first and not _other_process_holds("cpu-reused")
    assert _other_process_holds("cpu-reused")  # released between holds
    with measurement_lock("cpu-reused") as second:
        assert second and device_lock._LOCKS[str(lock_path("cpu-reused"))].fd == fd
        assert not _other_process_holds("cpu-reused")


def test_a_removed_lock_file_is_made_again(lock_dir: Path) -> None:
    with measurement_lock("cpu-removed"):
        pass
    lock_path("cpu-removed").unlink()
    with measurement_lock("cpu-removed") as alone:
        assert alone and lock_path("cpu-removed").exists()
        assert not _other_process_holds("cpu-removed")
    for path in lock_dir.iterdir():
        path.unlink()
    lock_dir.rmdir()
    with measurement_lock("cpu-removed") as alone:
        assert alone and not _other_process_holds("cpu-removed")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_does_not_share_its_parents_hold() -> None:
    with measurement_lock("cpu-forked") as held:
        assert held
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its own hold, not its parent's (which it must wait for)
            try:
                with measurement_lock("cpu-forked", timeout_s=0.05) as child:
                    os.write(write, b"1" if child else b"0")
            finally:
                os._exit(0)
        os.close(write)
        got = os.read(read, 1)
        os.close(read)
        os.waitpid(pid, 0)
    assert got == b"0"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_forked_child_leaving_its_parents_hold_still_waits_for_it() -> None:
    """A child forked inside a hold leaves the ``with`` block it inherited: that is not a
    release of its own (no error), and its next hold still waits for the parent's."""
    parent = os.getpid()
    read, write = os.pipe()
    got = b""
    try:
        with measurement_lock("cpu-fork-leaves") as held:
            assert held
            if os.fork() != 0:
                os.close(write)
                got = os.read(read, 1)  # still holding, until the child has tried
                os.close(read)
                os.wait()
        if os.getpid() != parent:  # the child, out of the block it inherited
            with measurement_lock("cpu-fork-leaves", timeout_s=0.05) as again:
                os.write(write, b"1" if again else b"0")
    except BaseException:
        if os.getpid() != parent:
            os.write(write, b"e")  # leaving the inherited block raised
        raise
    finally:
        if os.getpid() != parent:
            os._exit(0)
    assert got == b"0"
