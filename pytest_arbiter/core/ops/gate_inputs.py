"""What the built-in ops' generated gate inputs share: the ragged shapes they probe and
the named list they are returned in."""

from __future__ import annotations

from typing import Any

import numpy as np

TAILS = ((127, 1, 127), (1, 127, 73))
"""The tails of the ragged-tail inputs past a multiple of 128, per trial, for matmul's
(M, N, K) and (first two) softmax's last axis: 127 leaves the largest remainder at every
tile size 8 to 128 (7, 15, ..., 127), 1 the smallest, 73 a middling one (1, 9, 9, 9, 73)."""


def ragged_dim(d: int) -> int:
    return d + 1 if d % 2 == 0 else d


def tail_dim(d: int, r: int) -> int:
    return (128 if d >= 128 else 0) + r


def reduced_k(k: int) -> int:
    """A K of at most 511 with ``k``'s alignment up to 256 (for the inputs whose point is
    their values, not the length of the sums)."""
    return k if k <= 256 else 256 + k % 256


class GateInputs(list[tuple[np.ndarray, ...]]):
    """An op's generated gate inputs in order, each with a name saying what it probes."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def add(self, name: str, *arrays: np.ndarray) -> None:
        self.append(tuple(arrays))
        self.names.append(name)


def draw_dtype(dtype: str) -> type[np.floating[Any]]:
    """Random values for a float64 region are drawn in float64; for narrower ones float32
    draws (twice as fast) are exact in the target after the cast anyway."""
    return np.float64 if dtype == "float64" else np.float32
