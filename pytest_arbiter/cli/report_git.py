"""What git knows of a corpus file, for ``pytest-arbiter report``: the commit that last
changed it (the page's header) and every committed version of it (``--history``).
git runs as a subprocess in the file's folder; no shell, every argument a list item."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pytest_arbiter.errors import ArtifactError
from pytest_arbiter.store.safetext import escape

GIT_TIMEOUT_S = 60
_FIELDS = "%H%x00%h%x00%cI%x00%an%x00%s"
_RECORD = "\x1e"
_REPOSITORY_VARIABLES = frozenset({"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE",
                                   "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR"})


@dataclass(frozen=True)
class Commit:
    """One commit that changed the corpus file."""

    sha: str
    short: str
    date: str
    """The committer date, ISO 8601."""
    author: str
    subject: str
    path: str
    """The file's path in that commit, from the repository's top (it may have moved)."""

    def describe(self) -> str:
        return f"{self.short} {self.date[:10]} {self.subject}"


def git(folder: Path, *args: str) -> bytes:
    """git's standard output; ``ArtifactError`` with git's message when it fails."""
    # the repository is the file's: not one a calling git hook points at
    env = {k: v for k, v in os.environ.items() if k not in _REPOSITORY_VARIABLES}
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True,
                              timeout=GIT_TIMEOUT_S, check=False,
                              env={**env, "GIT_PAGER": "cat", "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError) as exc:
        raise ArtifactError(f"cannot run git: {escape(exc)}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ArtifactError(f"git {escape(args[0])} in {escape(folder)}: "
                            f"{escape(message[-1] if message else done.returncode)}")
    return done.stdout


def commits(path: str | os.PathLike[str], limit: int | None = None,
            follow: bool = True) -> list[Commit]:
    """The commits that changed ``path``, newest first (across renames with
    ``follow``); ``ArtifactError`` outside a git repository."""
    file = Path(path).resolve()
    out = git(file.parent, "log", *(["--follow"] if follow else []), "--name-only",
              f"--format={_RECORD}{_FIELDS}",
              *([f"--max-count={limit}"] if limit else []), "--", file.name)
    return list(_parse_log(out.decode("utf-8", "replace")))


def _parse_log(text: str) -> Iterator[Commit]:
    for record in text.split(_RECORD):
        lines = [ln for ln in record.split("\n") if ln]
        if not lines:
            continue
        fields = lines[0].split("\x00")
        if len(fields) != 5 or len(lines) < 2:
            continue
        sha, short, date, author, subject = fields
        yield Commit(sha, short, date, author, subject, lines[-1])


def last_commit(path: str | os.PathLike[str]) -> Commit | None:
    """The commit that last changed ``path`` (``None``: not in git, or never
    committed)."""
    try:
        found = commits(path, limit=1, follow=False)
    except ArtifactError:
        return None
    return found[0] if found else None


def changed_since_commit(path: str | os.PathLike[str]) -> bool:
    """Whether the file differs from its last committed version."""
    file = Path(path).resolve()
    try:
        return bool(git(file.parent, "status", "--porcelain", "--", file.name).strip())
    except ArtifactError:
        return False


def version(commit: Commit, folder: Path) -> bytes | None:
    """The file's bytes at ``commit`` (``None``: the commit deleted it)."""
    try:
        return git(folder, "show", f"{commit.sha}:{commit.path}")
    except ArtifactError:
        return None
