"""Regions: one concrete instance of an op (shapes and dtype), and their cache buckets."""

from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT_CAP = 16


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _alignment(n: int) -> int:
    """The largest power of two dividing ``n``, capped: the alignment class of a dimension."""
    if n == 0:
        return ALIGNMENT_CAP
    return min(n & -n, ALIGNMENT_CAP)


def bucket_dims(dims: tuple[int, ...]) -> str:
    """Bucket a shape: each dimension rounded up to a power of two, plus its alignment class.

    The alignment class keeps a 24-row and a 32-row shape apart, so a winner that
    needs 16-aligned rows is not reused for a ragged shape by construction; the hit
    path re-checks ``accepts`` as well, for every other reason a kernel may refuse.
    """
    sizes = "x".join(str(_pow2_ceil(d)) for d in dims)
    aligns = ".".join(str(_alignment(d)) for d in dims)
    return f"{sizes}/a{aligns}"


@dataclass(frozen=True)
class Region:
    """One concrete instance of an op: its input shapes and dtype."""

    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: str

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(d for shape in self.shapes for d in shape)

    def bucket(self) -> str:
        return bucket_dims(self.dims)

    def describe(self) -> str:
        shapes = ", ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        return f"{self.op}({shapes}; {self.dtype})"


@dataclass(frozen=True)
class MatmulRegion(Region):
    """``A (m x k) @ B (k x n)``."""

    @classmethod
    def of(cls, m: int, n: int, k: int, dtype: str) -> MatmulRegion:
        return cls("matmul", ((m, k), (k, n)), dtype)

    @property
    def m(self) -> int:
        return self.shapes[0][0]

    @property
    def k(self) -> int:
        return self.shapes[0][1]

    @property
    def n(self) -> int:
        return self.shapes[1][1]

    def bucket(self) -> str:
        return bucket_dims((self.m, self.n, self.k))

    def describe(self) -> str:
        return f"matmul(m={self.m}, n={self.n}, k={self.k}; {self.dtype})"


@dataclass(frozen=True)
class SoftmaxRegion(Region):
    """Softmax along the last axis of one array."""

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: str) -> SoftmaxRegion:
        return cls("softmax", (tuple(shape),), dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.shapes[0]

    def bucket(self) -> str:
        rows = 1
        for d in self.shape[:-1]:
            rows *= d
        return bucket_dims((rows, self.shape[-1] if self.shape else 1))
