"""Writing the artifacts: atomic replacement, the lock (a held one, a dead writer's),
symbolic links written at their target, concurrent writers who lose nothing, and
``update_cache`` merging into what is on disk."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import (
    MeasureCache,
)
from tests.factories import T1, cache_bytes, cache_entry

CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from pytest_arbiter.store import artifacts
    from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
    from pytest_arbiter.timing.measure import LatencyStats

    path, worker, rounds, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    stats = LatencyStats(10.0, 9.0, 9.5, 10.5, 12.0, 5)
    while not go.exists():
        time.sleep(0.002)
    for r in range(rounds):
        e = CacheEntry("dev", "cpu", "matmul", f"w{worker}-r{r}", "float32",
                       (RankedCandidate("k", stats),), 1.0, False, {}, {"host": f"w{worker}"})
        artifacts.update_cache(path, [e])
""")


@pytest.mark.slow
def test_eight_processes_adding_entries_concurrently_lose_none(tmp_path: Path) -> None:
    path, go = tmp_path / "cache.json", tmp_path / "go"
    workers, rounds = 8, 25
    cache_bytes(path, cache_entry("seed"))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(w), str(rounds),
                               str(go)]) for w in range(workers)]
    time.sleep(0.5)
    go.touch()
    assert [p.wait(timeout=120) for p in procs] == [0] * workers
    cache = artifacts.read_cache(path)
    expected = {f"w{w}-r{r}" for w in range(workers) for r in range(rounds)} | {"seed"}
    assert {e.bucket for e in cache.entries()} == expected
    assert not list(tmp_path.glob(".cache.json.*.tmp"))


KILLED = textwrap.dedent("""
    import os, signal, sys
    from pytest_arbiter.store import artifacts
    from pytest_arbiter.store.cache import CacheEntry, RankedCandidate
    from pytest_arbiter.timing.measure import LatencyStats

    def die(src, dst):
        os.kill(os.getpid(), signal.SIGKILL)

    artifacts.os.replace = die  # the temporary file is written and fsynced; no rename
    e = CacheEntry("dev", "cpu", "matmul", "killed", "float32",
                   (RankedCandidate("k", LatencyStats(1.0, 1.0, 1.0, 1.0, 1.0, 3)),))
    artifacts.update_cache(sys.argv[1], [e])
""")


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_writer_killed_before_rename_leaves_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.json"
    before = cache_bytes(path, cache_entry("old"))
    proc = subprocess.run([sys.executable, "-c", KILLED, str(path)], timeout=60)
    assert proc.returncode == -9
    assert path.read_bytes() == before
    stale = list(tmp_path.glob(".cache.json.*.tmp"))
    assert len(stale) == 1 and b'"killed"' in stale[0].read_bytes()
    # the dead writer's lock is gone with it; the next writer cleans up after it
    artifacts.update_cache(path, [cache_entry("new")], timeout=10)
    assert {e.bucket for e in artifacts.read_cache(path).entries()} == {"old", "new"}
    assert not list(tmp_path.glob(".cache.json.*.tmp"))


def test_lock_timeout_is_a_clear_error(tmp_path: Path) -> None:
    import filelock

    path = tmp_path / "cache.json"
    before = cache_bytes(path, cache_entry())
    with filelock.FileLock(str(artifacts.lock_path(path))):
        code = ("import sys; from pytest_arbiter.store import artifacts\n"
                "from pytest_arbiter.errors import ArtifactError\n"
                "try:\n    artifacts.update_cache(sys.argv[1], [], timeout=0.2)\n"
                "except ArtifactError as e:\n    print(e); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                              text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "cache.json.lock stayed locked for 0.2 s" in proc.stdout
    assert path.read_bytes() == before


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links")
def test_a_symlinked_cache_is_locked_and_written_at_its_target(tmp_path: Path) -> None:
    """Before, the atomic replace turned the link into a regular file (the target kept
    the old entries: the corpus forked) and the lock sat beside the link."""
    real = tmp_path / "store" / "corpus.json"
    real.parent.mkdir()
    cache_bytes(real, cache_entry("old"))
    link = tmp_path / "work" / "cache.json"
    link.parent.mkdir()
    link.symlink_to(os.path.relpath(real, link.parent))
    chained = tmp_path / "chained.json"
    chained.symlink_to(link)
    assert artifacts.lock_path(link) == artifacts.lock_path(chained) == \
        real.with_name("corpus.json.lock")
    artifacts.update_cache(link, [cache_entry("new")])
    artifacts.write_cache(chained,
                          MeasureCache([*artifacts.read_cache(real), cache_entry("third")]))
    assert link.is_symlink() and chained.is_symlink()
    assert {e.bucket for e in artifacts.read_cache(real)} == {"old", "new", "third"}
    assert sorted(p.name for p in link.parent.iterdir()) == ["cache.json"]
    assert not list(real.parent.glob(".corpus.json.*.tmp"))
    # a link to nothing: an error, never a file made wherever it points
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "store" / "new.json")
    with pytest.raises(ArtifactError, match="which does not exist"):
        artifacts.update_cache(dangling, [cache_entry("x")])
    assert dangling.is_symlink() and not (tmp_path / "store" / "new.json").exists()


def test_write_error_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"no/such/c\.json"):
        artifacts.update_cache(tmp_path / "no" / "such" / "c.json", [cache_entry()])
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_atomic_write_keeps_normal_permissions(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    cache_bytes(path, cache_entry())
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask
    path.chmod(0o640)
    cache_bytes(path, cache_entry("other"))
    assert path.stat().st_mode & 0o777 == 0o640


def test_update_cache_spares_the_read_of_a_file_unchanged_since_it_was_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuning run read the corpus at its start: while the file is the one it read
    (same stamp under the lock), its write does not read it again; once another writer
    replaced it, it does, and keeps that writer's entries."""
    path = tmp_path / "c.json"
    cache_bytes(path, cache_entry("a"), cache_entry("b"))
    read, stamp = artifacts.read_cache_stamped(path)
    assert stamp is not None and stamp == artifacts.stamp_of(path)
    reads: list[object] = []
    real_read = artifacts.read_cache
    monkeypatch.setattr(artifacts, "read_cache",
                        lambda p: reads.append(p) or real_read(p))  # type: ignore[func-returns-value]
    artifacts.update_cache(path, [cache_entry("c")], known=(stamp, read))
    assert reads == [] and {e.bucket for e in real_read(path)} == {"a", "b", "c"}
    # the write replaced the file: the old stamp no longer stands for it
    artifacts.update_cache(path, [cache_entry("d")], known=(stamp, read))
    assert reads == [path] and {e.bucket for e in real_read(path)} == {"a", "b", "c", "d"}
    assert artifacts.stamp_of(tmp_path / "missing.json") is None


def test_a_tuning_write_replaces_an_entry_of_other_code_whatever_its_since(
        tmp_path: Path) -> None:
    """A runner whose clock is two hours ahead stamped the corpus's entry; this run
    measured the key against the code that runs now: its entry is kept, not the
    stale one with the later stamp. A plain merge still follows the stamps."""

    path = tmp_path / "c.json"
    ahead = T1 + datetime.timedelta(hours=2)
    stale = cache_entry(winner="old", runner_up="b", fingerprints={"old": "0" * 16}, since=ahead)
    artifacts.write_cache(path, artifacts.MeasureCache([stale]))
    fresh = cache_entry(winner="new", runner_up="b", fingerprints={"new": "1" * 16}, since=T1)
    assert artifacts.update_cache(path, [fresh]).entries[stale.key[:]].winner == "old"
    artifacts.write_cache(path, artifacts.MeasureCache([stale]))
    kept = artifacts.update_cache(path, [fresh], measured_now=True)
    assert next(iter(kept.entries.values())).winner == "new"
    assert artifacts.read_cache(path).entries()[0].winner == "new"
