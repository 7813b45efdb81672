"""What a run covered, and so what its artifacts may replace without losing work.

A baseline written from a ``-k`` subset, a ``--lf`` rerun or a run whose worker crashed
must not drop the known entries of the tests it did not run; a collect-only run
dispatches nothing and writes nothing. These are plain functions over counts, tested
without pytest; the plugin fills a :class:`RunScope` from the session.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_arbiter.gating.histogram import STALE, HistogramKey, named_keys


@dataclass(frozen=True)
class RunScope:
    """How much of the suite a run covered.

    ``partial``: why the run did not run every test (deselection, explicit paths,
    ``--lf``, an early stop): its counts are right for what ran, silent on the rest.
    ``incomplete``: why its counts miss dispatches of tests that did run (a crashed
    worker, an interrupted session): its histogram and baseline are not written.
    """

    partial: tuple[str, ...] = ()
    incomplete: tuple[str, ...] = ()
    collect_only: bool = False


def baseline_to_write(run: Mapping[HistogramKey, int], old: Mapping[HistogramKey, int],
                      scope: RunScope, dispatched: Mapping[HistogramKey, int] | None = None
                      ) -> tuple[dict[HistogramKey, int], list[HistogramKey]]:
    """The baseline a run writes, and the old entries it kept without checking them.

    ``run``: the run's gated counts (a test that degrades on purpose adds nothing: the
    baseline tolerates what unmarked tests do); ``dispatched``: every count, the
    on-purpose ones too (``run`` when not given). An old entry is dropped only when this
    run covered the whole suite and dispatched its target and op without it (then it is
    fixed); a ``stale`` one is always kept. A partial run keeps every old entry, with the
    larger of the two counts where both have it.
    """
    run, old = named_keys(run), named_keys(old)
    covered = {(k.target, k.op) for k, v in named_keys(
        run if dispatched is None else dispatched).items() if v > 0}
    out = {k: v for k, v in run.items() if v > 0}
    kept: list[HistogramKey] = []
    for key, count in sorted(old.items()):
        if count <= 0:
            continue
        if key in out:
            if scope.partial:
                out[key] = max(out[key], count)
            continue
        # a stale entry's absence may only mean no recheck reached the key
        if scope.partial or (key.target, key.op) not in covered or key.outcome == STALE:
            out[key] = count
            kept.append(key)
    return out, kept


def unwritable(path: Path) -> str | None:
    """Why an artifact cannot be written at ``path`` (checked before any test runs),
    or None: the folder must exist and be writable, and the path must not be a folder."""
    target = path.resolve() if path.is_symlink() else path
    folder = target.parent
    if target.is_dir():
        return f"{path} is a folder"
    if not folder.is_dir():
        return (f"{folder} is a file, not a folder" if folder.exists()
                else f"the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the folder {folder} is not writable"
    if target.exists() and not os.access(target, os.W_OK):
        return f"{target} is not writable"
    return None
