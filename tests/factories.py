"""What many test modules build: paths, latency statistics, cache entries, candidates.

One definition each, with parameters where the modules need different values, so a
test states what it depends on and a change of a constructor is made in one place.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_arbiter.core.candidates import CandidateRegistry, FunctionCandidate
from pytest_arbiter.store import artifacts
from pytest_arbiter.store.cache import (
    NO_SINCE,
    CacheEntry,
    Considered,
    MeasureCache,
    RankedCandidate,
)
from pytest_arbiter.store.cache_file import encode_document
from pytest_arbiter.timing.measure import ComparePolicy, LatencyStats

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root folder (the checkout, or the unpacked sdist)."""

FAST = ComparePolicy(min_rounds=3, max_rounds=30, budget_s=0.005)
"""A comparison short enough for a unit test, long enough to tell 4x apart."""

UTC = datetime.timezone.utc
T0 = datetime.datetime(2026, 12, 1, 6, 0, tzinfo=UTC)
T1 = datetime.datetime(2026, 12, 2, 6, 0, tzinfo=UTC)
MEASURED_AT = "2026-12-03T06:00:00Z"


# -- latencies and cache entries -----------------------------------------------------------


def stats(median: float, samples: int = 25, spread: float = 0.1) -> LatencyStats:
    """Latencies around ``median``: the quartiles ``spread`` apart (a fraction of the
    median), the minimum one ``spread`` below the median and the maximum two above."""
    return LatencyStats(median, median * (1 - spread), median * (1 - spread / 2),
                        median * (1 + spread / 2), median * (1 + 2 * spread), samples)


def cache_entry(bucket: str = "m32-n16-k32", winner: str = "a", *, device: str = "dev0",
                confidence: float = 0.999, samples: int = 25, spread: float = 0.1,
                tie: bool = False, host: str = "h1", runner_up: str | None = "b",
                fingerprints: dict[str, str] | None = None,
                since: datetime.datetime = NO_SINCE,
                environment: dict[str, str] | None = None,
                median: float = 1000.0) -> CacheEntry:
    """A CPU matmul entry with every field a tuning run writes: the winner, a runner-up
    half as fast again, a rejected candidate, the full provenance."""
    ranking = [RankedCandidate(winner, stats(median, samples, spread))]
    if runner_up is not None:
        ranking.append(RankedCandidate(runner_up, stats(median * 1.5, samples, spread)))
    prov = {"host": host, "device_name": "Test Device", "measured_at": MEASURED_AT,
            "versions": {"pytest-arbiter": "0.1.0"}, "rounds": samples, "timed_ns": 12345,
            "shapes": [[32, 32], [32, 16]]}
    considered = {name: Considered(fp, "timed") for name, fp in (fingerprints or {}).items()}
    return CacheEntry(device, "cpu", "matmul", bucket, "float32", tuple(ranking), confidence,
                      tie, {"slow": "failed the F4 gate: too far"}, prov, considered,
                      environment or {}, since=since)


def ranked_entry(bucket: str, *names: str, medians: Sequence[float] = (1000.0, 1500.0, 2000.0),
                 device: str = "sm_90", op: str = "matmul", dtype: str = "float16",
                 confidence: float | None = None, tie: bool = False, spread: float = 0.1,
                 host: str = "h1", considered: Mapping[str, Considered] | None = None,
                 reverify: bool = False, ratios: Sequence[float] | None = None
                 ) -> CacheEntry:
    """An NVIDIA entry ranking ``names`` at ``medians`` (with paired ``ratios``, if
    given), as the CLI's tests show, merge and gate them; a tie's confidence is 0.5
    unless given."""
    paired = list(ratios) if ratios is not None else [None] * len(names)
    ranking = tuple(RankedCandidate(name, stats(median, spread=spread), ratio=ratio)
                    for name, median, ratio in zip(names, medians, paired, strict=False))
    if confidence is None:
        confidence = 0.5 if tie else 0.999
    return CacheEntry(device, "nvidia", op, bucket, dtype, ranking, confidence, tie, {},
                      {"host": host, "measured_at": MEASURED_AT}, dict(considered or {}),
                      reverify=reverify)


def cache_bytes(path: Path, *entries: CacheEntry) -> bytes:
    """Write ``entries`` as the cache file at ``path``; its bytes."""
    artifacts.write_cache(path, MeasureCache(entries))
    return path.read_bytes()


def cache_document(*entries: CacheEntry) -> dict[str, Any]:
    """The cache file of ``entries`` as parsed JSON, to change and write back."""
    parsed: dict[str, Any] = json.loads(encode_document(entries))
    return parsed


# -- candidates ----------------------------------------------------------------------------


def fn(kernel: Callable[..., Any], name: str, op: str = "matmul", tier: int = 0,
       accepts: Callable[..., bool] | None = None, target: str = "cpu") -> FunctionCandidate:
    """A candidate for ``op`` made of a plain function."""
    return FunctionCandidate(kernel, name, op, target, tier, accepts, None)


def registry_of(*cands: FunctionCandidate) -> CandidateRegistry:
    """A registry holding only ``cands`` (the ``registry`` fixture holds the bundled ones)."""
    reg = CandidateRegistry()
    reg.extend(cands)
    return reg


def library(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The library's matmul: the correct, general candidate."""
    out: np.ndarray = np.matmul(a, b)
    return out


def mats(m: int = 16, n: int | None = None, k: int | None = None,
         dtype: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """The operands of an (m x k) @ (k x n) product, seeded by the shape; square when
    only ``m`` is given."""
    n = m if n is None else n
    k = m if k is None else k
    rng = np.random.default_rng(m * 1000 + n * 10 + k)
    return (rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))


# -- timing ------------------------------------------------------------------------------


class ScriptedTimer:
    """A timer whose every call of a named function "takes" its scripted nanoseconds (a
    number, or a function of the call's number); a name listed in ``raise_on`` raises on
    that call (1-based, warmup calls included). It times nothing: tests count rounds."""

    def __init__(self, times: Mapping[str, float | Callable[[int], float]],
                 raise_on: Mapping[str, int] | None = None) -> None:
        self.times = dict(times)
        self.raise_on = dict(raise_on or {})
        self.calls = dict.fromkeys(self.times, 0)
        """How many times each function ran."""
        self.samples = 0
        """How many samples were taken."""
        self.last = ""

    def fns(self) -> dict[str, Callable[[], object]]:
        """The functions to compare, one per scripted name."""

        def make(name: str) -> Callable[[], object]:
            def run() -> None:
                self.calls[name] += 1
                self.last = name
                if self.calls[name] == self.raise_on.get(name):
                    raise RuntimeError(f"{name} broke on call {self.calls[name]}")

            return run

        return {n: make(n) for n in self.times}

    def sample(self, fn: Callable[[], object]) -> float:
        fn()
        self.samples += 1
        took = self.times[self.last]
        return took(self.calls[self.last]) if callable(took) else took


# -- a user op's kernels: logsumexp, right and wrong ---------------------------------------


def lse_ref(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float64)
    top = w.max(axis=-1, keepdims=True)
    out: np.ndarray = (top + np.log(np.exp(w - top).sum(axis=-1, keepdims=True)))[..., 0]
    return out


def lse_shifted(x: np.ndarray) -> np.ndarray:
    w = x.astype(np.float32)
    top = w.max(axis=-1, keepdims=True)
    return (top[..., 0] + np.log(np.exp(w - top).sum(axis=-1))).astype(x.dtype)


def lse_naive(x: np.ndarray) -> np.ndarray:
    """No max shift: ``exp`` overflows once the logits pass 88 (float32 math)."""
    return np.log(np.exp(x.astype(np.float32)).sum(axis=-1)).astype(x.dtype)


def make_confident(path: Path) -> None:
    """The cache at ``path`` with every low-confidence pick made a confident one.

    A tune on a loaded machine may end a comparison short of its confidence target, by
    design; a test of what a clean run prints needs a pick the summary has no reason to
    list, whatever the machine's load was while it was measured."""
    import msgspec

    from pytest_arbiter.store.entry import MIN_ROUNDS

    def sure(e: CacheEntry) -> CacheEntry:
        if not e.low_confidence:
            return e
        rounds = max(MIN_ROUNDS, e.provenance.rounds or 0)
        provenance = msgspec.structs.replace(e.provenance, rounds=rounds)
        return msgspec.structs.replace(e, confidence=0.999, provenance=provenance)

    artifacts.write_cache(path, MeasureCache([sure(e) for e in artifacts.read_cache(path)]))
    assert not any(e.low_confidence for e in artifacts.read_cache(path))
