"""Regions: one concrete instance of an op (shapes and dtype), and their cache buckets."""

from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT_CAP = 16


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _alignment(n: int, cap: int = ALIGNMENT_CAP) -> int:
    """The largest power of two dividing ``n``, capped: the alignment class of a dimension."""
    if n == 0:
        return cap
    return min(n & -n, cap)


def bucket_dims(dims: tuple[int, ...], needs: tuple[int, ...] = ()) -> str:
    """Bucket a shape: each dimension rounded up to a power of two, plus its alignment class.

    The text reads ``SIZES/aALIGNS``: ``32x16x32/a16.8.16`` is a shape whose dimensions
    round up to 32, 16 and 32 and are divisible by 16, 8 and 16 (the largest power of two
    dividing each, capped as below). A matmul's dimensions are M, N, K; a softmax's, the
    input's; an op's own, every input's in order (its :meth:`Region.bucket` adds the
    ranks: ``/r2.2``).

    The alignment class keeps a 24-row and a 32-row shape apart, so a winner that
    needs 16-aligned rows is not reused for a ragged shape by construction; the hit
    path re-checks ``accepts`` as well, for every other reason a kernel may refuse.
    ``needs``: per dimension, the largest alignment a registered candidate declares
    (``candidate(..., align=...)``); the class is capped at 16 or at that, whichever
    is larger, so a K%32 kernel's shapes never share a key with K%16-only ones.
    """
    sizes = "x".join(str(_pow2_ceil(d)) for d in dims)
    caps = [max(ALIGNMENT_CAP, needs[i]) if i < len(needs) else ALIGNMENT_CAP
            for i in range(len(dims))]
    aligns = ".".join(str(_alignment(d, cap)) for d, cap in zip(dims, caps, strict=True))
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

    def bucket(self, needs: tuple[int, ...] = ()) -> str:
        """The cache bucket; ``/r`` lists each input's rank, so (2, 3), (4,) and
        (2,), (3, 4) never share a key."""
        ranks = ".".join(str(len(s)) for s in self.shapes)
        return f"{bucket_dims(self.dims, needs)}/r{ranks}"

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

    def bucket(self, needs: tuple[int, ...] = ()) -> str:
        return bucket_dims((self.m, self.n, self.k), needs)

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

    def bucket(self, needs: tuple[int, ...] = ()) -> str:
        """(rows, last axis); a rank other than 2 is added as ``/rN``, so a (128,)
        input never shares a key with a (1, 128) one."""
        rows = 1
        for d in self.shape[:-1]:
            rows *= d
        text = bucket_dims((rows, self.shape[-1] if self.shape else 1), needs)
        return text if len(self.shape) == 2 else f"{text}/r{len(self.shape)}"
