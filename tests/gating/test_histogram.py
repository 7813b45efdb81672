"""The dispatch histogram in memory: one counter per (target, op, candidate, outcome),
safe under threads, refusing an unknown outcome, and the payload its file is made of."""

from __future__ import annotations

import threading

import pytest

from pytest_arbiter import DispatchHistogram
from pytest_arbiter.gating import histogram_file


def test_histogram_is_thread_safe_and_round_trips() -> None:
    hist = DispatchHistogram()
    key = ("cpu", "matmul", "k", "won")

    def hammer() -> None:
        for _ in range(5000):
            hist.add(key)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hist.counts() == {key: 40000}
    assert len(hist) == 1
    hist.record("cpu", "softmax", "s", "degraded", 2)
    data = histogram_file.payload(hist.counts())
    assert data["schema"] == "pytest-arbiter/histogram" and data["version"] == 1
    assert [e["op"] for e in data["entries"]] == ["matmul", "softmax"]
    assert histogram_file.counts_of(data)[0] == hist.counts()
    with pytest.raises(ValueError, match="outcome"):
        hist.record("cpu", "matmul", "k", "exploded")
