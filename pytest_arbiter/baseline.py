"""The degrade gate: compare a run's histogram with the committed baseline."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_arbiter.histogram import HistogramKey

FAILING_OUTCOMES = ("degraded",)

EntryKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class BaselineVerdict:
    """New failing entries (not in the baseline), known ones, and fixed ones."""

    new: dict[HistogramKey, int]
    known: dict[HistogramKey, int]
    fixed: list[HistogramKey]

    @property
    def passed(self) -> bool:
        return not self.new

    def describe_new(self) -> list[str]:
        return [f"new {k[3]}: target={k[0]} op={k[1]} candidate={k[2]} ({v} dispatches)"
                for k, v in sorted(self.new.items())]

    def describe_fixed(self) -> list[str]:
        return [f"fixed {k[3]}: target={k[0]} op={k[1]} candidate={k[2]} "
                "(no longer seen; tighten the baseline)" for k in self.fixed]


def compare_to_baseline(run: Mapping[HistogramKey, int], baseline: Mapping[HistogramKey, int],
                        *, failing: tuple[str, ...] = FAILING_OUTCOMES) -> BaselineVerdict:
    """A ``failing`` entry of ``run`` fails unless ``baseline`` lists the same key.

    Baseline keys whose outcome is failing but that ``run`` no longer has are "fixed".
    """
    new = {k: v for k, v in run.items() if k[3] in failing and v > 0 and k not in baseline}
    known = {k: v for k, v in run.items() if k[3] in failing and v > 0 and k in baseline}
    fixed = sorted(k for k, v in baseline.items()
                   if k[3] in failing and v > 0 and run.get(k, 0) == 0)
    return BaselineVerdict(new, known, fixed)
