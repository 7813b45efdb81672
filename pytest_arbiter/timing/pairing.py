"""The paired rounds' statistics of an interleaved comparison (``timing.measure``).

Pairwise win counts kept in NumPy as the rounds come in, the one-sided sign test and the
fewest wins it needs at a given number of rounds, and the paired ratios that rank the
candidates: a round times every candidate once, so each is compared with the others in
the same round, which cancels what the round's neighbours did to all of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # NumPy is imported where a comparison runs: reading a corpus needs none
    import numpy as np


@functools.lru_cache(maxsize=4096)
def sign_test_p(wins: int, trials: int) -> float:
    """One-sided p-value that ``wins`` of ``trials`` paired rounds arose by chance."""
    if trials == 0:
        return 1.0
    start = max(wins, 0)
    total, term = 0, math.comb(trials, start)
    for i in range(start, trials + 1):
        total += term
        term = term * (trials - i) // (i + 1)  # C(n, i + 1), exactly
    return total / (1 << trials)  # whole numbers: no float overflow past 1,023 rounds


@functools.lru_cache(maxsize=4096)
def wins_needed(trials: int, below: float) -> int:
    """The fewest wins of ``trials`` paired rounds whose sign-test p-value is under
    ``below`` (``trials + 1`` when none is). The p-value only falls as the wins grow, so
    a record has ``p < below`` exactly when it has at least this many wins. One pass
    down from ``trials`` wins, the tail summed as it goes: :func:`sign_test_p`'s value
    at each step (the same whole numbers, the same division)."""
    whole = 1 << trials
    tail, term = 0, 1  # C(n, n)
    for wins in range(trials, -1, -1):
        tail += term
        if not tail / whole < below:
            return wins + 1
        term = term * wins // (trials - wins + 1)  # C(n, wins - 1), exactly: no comb()
    return 0


@functools.lru_cache(maxsize=4096)
def bound_rank(trials: int, below: float) -> int:
    """The largest rank ``k`` (1-based) such that the median of ``trials`` values is
    under their ``k``-th largest with probability at least ``1 - below``, whatever their
    distribution (a binomial tail: ``P(Binomial(trials, 1/2) <= k - 1) <= below``); 0 when
    not even the largest bounds it at that level (too few values)."""
    whole = 1 << trials
    tail = 0
    for k in range(trials + 1):
        tail += math.comb(trials, k)
        if tail / whole > below:
            return k
    return trials


class WinCounts:
    """Pairwise win counts over the kept rounds: ``counts[a, b]`` rounds in which ``a``
    was faster than ``b``, both timed. One NumPy update a round instead of a Python
    loop over every pair."""

    def __init__(self, names: Sequence[str]) -> None:
        import numpy as np

        self.names = list(names)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.counts = np.zeros((len(self.names), len(self.names)), dtype=np.int64)
        # nobody beats themself, so the diagonal never counts: set out of reach, a row's
        # minimum is its record against the others
        np.fill_diagonal(self.counts, 2**62)
        self._among: tuple[int, tuple[np.ndarray, ...]] | None = None
        """The live candidates' rows and columns, by how many are live (they only
        ever leave, so the count names the set)."""

    def add(self, times: Mapping[str, float]) -> None:
        """Count one kept round: NaN for a candidate not in it, which wins no pair and
        loses none (every comparison with NaN is false)."""
        import numpy as np

        row = np.array([times.get(n, math.nan) for n in self.names], dtype=np.float64)
        self.counts += row[:, None] < row[None, :]

    def leader_record(self, live: Sequence[str]) -> int:
        """The weakest pairwise record (fewest wins against any other live candidate) of
        the live candidate whose weakest record is best; at least two live."""
        import numpy as np

        among = self.counts
        if len(live) < len(self.names):
            if self._among is None or self._among[0] != len(live):
                self._among = (len(live), np.ix_(*[[self.index[n] for n in live]] * 2))
            among = among[self._among[1]]
        return int(among.min(axis=1).max())


def stored_ratio(ratio: float) -> float:
    """A paired ratio as an entry stores it and every rule reads it: four significant
    digits (so the tie rule when measuring, and "as fast" when serving, judge the same
    number)."""
    return float(f"{ratio:.4g}")


def paired_leader(table: np.ndarray, medians: Sequence[float]) -> int:
    """The column (candidate) of ``table`` (rounds x candidates) that no other beats on
    the median paired ratio, starting from the lowest median (the first, on a tie)."""
    import numpy as np

    leader = min(range(len(medians)), key=medians.__getitem__)
    for _ in range(len(medians)):
        ratios = paired_ratios(table, leader)
        challenger = int(np.argmin(ratios))  # the first of equal ratios, as min() picks
        if challenger == leader or ratios[challenger] >= 1.0:
            return leader
        leader = challenger
    return leader


def paired_ratios(table: np.ndarray, leader: int) -> np.ndarray:
    """Each column's median over rounds of its time over column ``leader``'s time in the
    same round, the rounds where the leader took no time left out (1 with none left).
    ``np.median`` takes the middle value, or the two middle values' sum over 2: the
    ``statistics.median`` of the same ratios, bit for bit."""
    import numpy as np

    lead = table[:, leader]
    timed = lead > 0
    if not timed.any():
        return np.ones(table.shape[1])
    if not timed.all():
        table, lead = table[timed], lead[timed]
    result: np.ndarray = np.median(table / lead[:, None], axis=0)
    return result


def worst_p(table: np.ndarray, leader: int) -> float:
    """The sign test's p-value of column ``leader`` against its closest competitor."""

    wins = (table[:, leader][:, None] < table).sum(axis=0).tolist()
    rounds = table.shape[0]
    return max((sign_test_p(w, rounds) for i, w in enumerate(wins) if i != leader),
               default=0.0)


def ratio_upper(table: np.ndarray, leader: int, below: float) -> np.ndarray:
    """Each column's upper confidence bound on its median paired ratio to column
    ``leader`` (:func:`paired_ratios`' rounds), one-sided at ``below``: the
    :func:`bound_rank`-th largest ratio, infinite where the rounds are too few."""
    import numpy as np

    lead = table[:, leader]
    timed = lead > 0
    rounds = int(timed.sum())
    rank = bound_rank(rounds, below)
    if rank == 0:
        return np.full(table.shape[1], np.inf)
    ordered = np.sort(table[timed] / lead[timed][:, None], axis=0)
    bound: np.ndarray = ordered[rounds - rank]
    return bound
