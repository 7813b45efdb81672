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

A tune takes the lock once per key, so where ``fcntl`` is there a process keeps each
lock file open and only ``flock``\\ s it for a hold (two system calls, and one ``stat``
that reopens the file if it was deleted or replaced meanwhile); elsewhere a
``filelock.FileLock`` per file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout as LockTimeout

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK_DIR_ENV = "PYTEST_ARBITER_LOCK_DIR"
DEFAULT_TIMEOUT_S = 120.0
"""How long to wait for another process's timing before timing anyway (and saying so)."""

_POLL_S = 0.005
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_LOCKS: dict[str, _DeviceLock | FileLock] = {}
_PATHS: dict[tuple[str | None, str], Path] = {}
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


class _DeviceLock:
    """One lock file held open by this process: ``flock`` for each outermost hold, a
    re-entrant lock for the threads of the process (re-entrant within one). The file is
    opened again when a hold finds the path no longer names it (deleted, replaced) or
    the process is a fork's child (whose inherited descriptor shares the parent's lock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.threads = threading.RLock()
        self.depth = 0
        self.fd: int | None = None
        self.pid = 0

    def acquire(self, timeout: float) -> None:
        """Hold the lock, waiting at most ``timeout`` seconds (``LockTimeout`` after)."""
        deadline = time.monotonic() + timeout
        if not self.threads.acquire(timeout=timeout):
            raise LockTimeout(self.path)
        try:
            if self.depth == 0:
                self._flock(deadline)
            self.depth += 1
        except BaseException:
            self.threads.release()
            raise

    def release(self) -> None:
        self.depth -= 1
        try:
            if self.depth == 0 and self.fd is not None:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            self.threads.release()

    def _flock(self, deadline: float) -> None:
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(self.path) from None
                time.sleep(_POLL_S)
                continue
            if self._current(fd):
                return
            self._close()  # locked a file the path no longer names: lock the new one

    def _open(self) -> int:
        if self.fd is not None and self.pid != os.getpid():
            self._close()
        if self.fd is None:
            path = Path(self.path)
            path.parent.mkdir(parents=True, exist_ok=True)  # made again if removed
            self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
            self.pid = os.getpid()
            with contextlib.suppress(OSError):
                os.fchmod(self.fd, 0o666)  # the umask's cut: other users' runs share it
        return self.fd

    def _current(self, fd: int) -> bool:
        try:
            held, named = os.fstat(fd), os.stat(self.path)
        except OSError:
            return False
        return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)

    def _close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _lock_for(identity: str) -> _DeviceLock | FileLock:
    """The process's one lock object for ``identity``'s file (the folder made at the
    first use): a second object would wait on the first forever within a thread."""
    chosen = os.environ.get(LOCK_DIR_ENV)
    path = _PATHS.get((chosen, identity))
    if path is not None:
        lock = _LOCKS.get(str(path))
        if lock is not None:
            return lock
    with _LOCKS_GUARD:
        path = lock_path(identity)
        lock = _LOCKS.get(str(path))
        if lock is None:
            path.parent.mkdir(parents=True, exist_ok=True)  # OSError: times unlocked
            lock = _LOCKS[str(path)] = (
                _DeviceLock(str(path)) if fcntl is not None
                else FileLock(str(path), mode=0o666, thread_local=True))
        _PATHS[(chosen, identity)] = path
        return lock


def _forget_after_fork() -> None:
    # the child's threads and descriptors are not the parent's holds
    global _LOCKS_GUARD
    _LOCKS_GUARD = threading.Lock()
    for lock in _LOCKS.values():
        if isinstance(lock, _DeviceLock):
            lock.threads, lock.depth = threading.RLock(), 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


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
    lock: _DeviceLock | FileLock | None = None
    try:
        lock = _lock_for(identity)
        if isinstance(lock, _DeviceLock):
            lock.acquire(wait)
        else:
            lock.acquire(timeout=wait, poll_interval=_POLL_S)
    except (LockTimeout, OSError):
        lock = None
    holder = os.getpid()
    try:
        yield lock is not None
    finally:
        # a fork's child leaving its parent's hold: the hold (and the flock) is not its
        if lock is not None and os.getpid() == holder:
            lock.release()
