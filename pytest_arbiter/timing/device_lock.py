"""One timing at a time per device, across threads and processes.

Two pytest-xdist workers (or two pytest runs on one runner) timing candidates on the
same device at the same moment slow each other down unevenly, and the winner becomes
whichever candidate the other worker's timing hurt least. :func:`measurement_lock`
holds a file lock per physical device around each timed comparison, so workers gate
and plan in parallel but time one after the other on one device. A GPU is known by
its UUID (:func:`pytest_arbiter.extend.device.lock_identity`): eight H100s share the tag
``sm_90`` but not a lock, so eight xdist workers, one per GPU, time in parallel. The lock folder is
``PYTEST_ARBITER_LOCK_DIR`` when set, else ``pytest-arbiter-locks`` in the temporary
folder; the operating system drops a crashed holder's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout as LockTimeout

LOCK_DIR_ENV = "PYTEST_ARBITER_LOCK_DIR"
DEFAULT_TIMEOUT_S = 120.0
"""How long to wait for another process's timing before timing anyway (and saying so)."""

_POLL_S = 0.005
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_LOCKS: dict[str, FileLock] = {}
_LOCKS_GUARD = threading.Lock()


def lock_dir() -> Path:
    """The folder the lock files live in (not created)."""
    chosen = os.environ.get(LOCK_DIR_ENV)
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / "pytest-arbiter-locks"


def lock_path(device_tag: str) -> Path:
    """The lock file of ``device_tag``: its safe characters and a hash of the whole tag
    (so ``sm/90`` and ``sm_90`` do not share one)."""
    digest = hashlib.sha256(device_tag.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    safe = _UNSAFE.sub("_", device_tag)[:64].strip(".") or "device"
    return lock_dir() / f"{safe}-{digest}.lock"


def _lock_for(path: Path) -> FileLock:
    # one lock object per file in this process: filelock counts nested acquisitions
    # per thread on one object, where a second object would wait on the first forever
    with _LOCKS_GUARD:
        lock = _LOCKS.get(str(path))
        if lock is None:
            lock = _LOCKS[str(path)] = FileLock(str(path), mode=0o666, thread_local=True)
        return lock


@contextlib.contextmanager
def measurement_lock(identity: str, timeout_s: float | None = None) -> Iterator[bool]:
    """Hold the measurement lock of one device, named by ``identity`` (its tag and, where
    the probe gave one, its UUID: ``extend.device.lock_identity``) for the ``with``
    block; yields True when
    it was held, False when it could not be had within ``timeout_s`` (default
    :data:`DEFAULT_TIMEOUT_S`) or the lock file could not be made: the block runs
    either way. Re-entrant within a thread; other threads and processes wait.
    """
    wait = DEFAULT_TIMEOUT_S if timeout_s is None else max(0.0, timeout_s)
    lock: FileLock | None = None
    try:
        path = lock_path(identity)
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _lock_for(path)
        lock.acquire(timeout=wait, poll_interval=_POLL_S)
    except (LockTimeout, OSError):
        lock = None
    try:
        yield lock is not None
    finally:
        if lock is not None:
            lock.release()
