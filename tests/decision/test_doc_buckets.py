"""The buckets the docs show are the ones the code computes for their shapes."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_arbiter.core.candidates import REGISTRY
from pytest_arbiter.core.regions import MatmulRegion, Region, SoftmaxRegion

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _region(op: str, shapes: str, dtype: str) -> Region:
    dims = [tuple(int(d) for d in s.split("x")) for s in shapes.split(",")]
    if op == "matmul":
        (m, k), (_, n) = dims
        return MatmulRegion.of(m, n, k, dtype)
    return SoftmaxRegion.of(dims[0], dtype)


def test_the_cache_example_buckets_are_computed_ones() -> None:
    text = (DOCS / "artifacts.md").read_text()
    example = json.loads(text.split("```json\n", 1)[1].split("```", 1)[0])
    for entry in example["entries"]:
        region = _region(entry["op"], entry["provenance"]["shapes"], entry["dtype"])
        needs = REGISTRY.alignment_needs(entry["op"], entry["target"])
        assert region.bucket(needs) == entry["bucket"], entry["op"]


def test_the_contract_s_matmul_bucket_is_the_computed_one() -> None:
    text = (DOCS / "contract.md").read_text()
    assert "a float32 16x32 @ 32x16 matmul: bucket `16x16x32/a16.16.32`" in text
    needs = REGISTRY.alignment_needs("matmul", "cpu")
    assert MatmulRegion.of(16, 16, 32, "float32").bucket(needs) == "16x16x32/a16.16.32"
