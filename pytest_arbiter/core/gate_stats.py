"""The F4 gate's statistical checks, bias and spread, on a trial's sampled outputs
(docs/accuracy.md, "The statistical checks"). What they compute before they read an
output (the frame) is made for a gate's small trials at once (:func:`frames`): one pass of
NumPy calls over their samples side by side, each value as the trial's alone would have
it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import NamedTuple

import numpy as np

from pytest_arbiter.core.dtypes import precision, round_to, spacing
from pytest_arbiter.core.ops import ERROR_LAMBDA, ErrorModel
from pytest_arbiter.core.trials import PreparedTrial

STAT_ALPHA = 1e-9
"""False-alarm probability of each statistical check on one gate input (two-sided)."""
_LOG_TERM = math.log(2.0 / STAT_ALPHA)
_MIN_UNITS = 8
"""Fewer distinct outputs than this and the statistical checks say nothing."""
STAT_SAMPLE = 2048
"""The statistical checks look at this many outputs of a trial at most, evenly spread."""
_ROUNDING_VARIANCE = 1.0 / 12.0  # of one rounding to nearest, in ulp^2: the weights' floor
STAT_DTYPES = ("float32", "float16", "bfloat16")
_FLUSH_MARGIN = 64.0


@dataclass(frozen=True)
class _Units:
    """The sampled outputs of one trial, one entry per distinct (group, exact value), in
    units of the output's spacing (ulp) at the exact value."""

    d: np.ndarray  # got - round(exact): the error beyond a correctly rounded result
    z: np.ndarray  # got - exact
    z_ideal: np.ndarray  # round(exact) - exact: the correctly rounded result's own error
    sign: np.ndarray  # sign of the exact value
    sd: np.ndarray
    common: np.ndarray
    systematic: np.ndarray
    bound: np.ndarray  # the largest |z| the elementwise budget lets through
    group: np.ndarray  # the group (softmax row); each unit its own when nothing is shared


BiasTerms = tuple[np.ndarray, np.ndarray, float, float, float]
"""The bias check's weights, weights times the signs, threshold, allowance, total weight."""


class _SpreadTerms(NamedTuple):
    w: np.ndarray
    fit: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # w h, the groups' fit weight, h
    mean: float
    threshold: float
    total: float


@dataclass(frozen=True)
class _Frame:
    """What the statistical checks compute before they read an output: the sampled
    outputs (positions sorted and grouped, exact values, their spacing and correctly
    rounded values), the units' terms (:class:`_Units` but ``d`` and ``z``) and both
    checks' weights and thresholds (``None`` under _MIN_UNITS units)."""

    index: np.ndarray
    e: np.ndarray
    ulp: np.ndarray
    ideal: np.ndarray
    starts: np.ndarray | None  # where each unit of equal outputs starts; None: one each
    counts: np.ndarray | None
    units: _Units
    bias: BiasTerms | None
    spread: _SpreadTerms | None


class FrameRequest(NamedTuple):
    """One trial's frame to make: its exact result (flat), the output when the frame must
    leave out where it is not finite (``None``: the frame every output finite there
    shares), the error model and the trial's seed (which outputs are sampled)."""

    flat_exact: np.ndarray
    flat_got: np.ndarray | None
    model: ErrorModel
    seed: int


def _frame(flat_exact: np.ndarray, flat_got: np.ndarray | None, model: ErrorModel,
           dtype: str, seed: int) -> _Frame:
    """One trial's frame (:func:`frames`)."""
    return frames([FrameRequest(flat_exact, flat_got, model, seed)], dtype)[0]


def frames(requests: Sequence[FrameRequest], dtype: str) -> list[_Frame]:
    """Each request's frame, for outputs of ``dtype``: at most STAT_SAMPLE finite outputs,
    every k-th one (a choice fixed before the errors are seen, so the checks'
    false-alarm bound holds for the sample), and those where ``flat_got`` (if given) is
    finite. Outputs equal in the exact result and in one group are one unit: a
    deterministic kernel computes them alike, so their errors are one observation, not
    several.

    The samples of trials sampling at most BATCHED_UP_TO outputs are laid side by side,
    each trial's a block of its own (its groups numbered past the previous trial's), so
    one NumPy call serves them all; a sum over a trial's units is taken over its block
    alone, in its order, so each value is bit for bit the one the trial alone gets. A
    trial sampling more gets its frame alone."""
    out: list[_Frame | None] = [None] * len(requests)
    batch: list[int] = []
    held = 0
    for k, r in enumerate(requests):
        size = r.flat_exact.size
        sampled = -(-size // max(1, -(-size // STAT_SAMPLE)))
        if sampled > BATCHED_UP_TO:
            out[k] = _frame_alone(r, dtype)
            continue
        if held + sampled > BATCH_SAMPLES:
            _into(out, batch, requests, dtype)
            batch, held = [], 0
        batch.append(k)
        held += sampled
    _into(out, batch, requests, dtype)
    return [f for f in out if f is not None]


BATCHED_UP_TO = 512
"""A trial sampling more outputs than this gets its frame alone: NumPy's calls then cost
more in arithmetic than in calls, and one trial's arrays stay in the fastest cache."""
BATCH_SAMPLES = 4096
"""The samples of the trials whose frames are made together, at most."""


def _into(out: list[_Frame | None], batch: list[int], requests: Sequence[FrameRequest],
          dtype: str) -> None:
    if batch:
        for k, frame in zip(batch, _batch([requests[k] for k in batch], dtype),
                            strict=True):
            out[k] = frame


def _batch(requests: Sequence[FrameRequest], dtype: str) -> list[_Frame]:
    s = _Samples.of(requests, dtype)
    scales = np.empty((4, s.e.size))
    for i, r in enumerate(requests):
        a, b = s.bounds[i], s.bounds[i + 1]
        at = s.at[a:b]
        scales[0, a:b], scales[1, a:b], scales[2, a:b] = r.model.scales(at)
        scales[3, a:b] = r.model.allowed.reshape(-1)[at]
    maxima = scales / s.ulp  # in ulp, each row divided as it would be alone
    z_ideal = (s.ideal - s.e) / s.ulp
    sign = np.sign(s.e)
    starts = np.flatnonzero(np.concatenate(([True], ~s.same)))
    counts = np.diff(np.append(starts, s.e.size))
    if starts.size < s.e.size:
        z_ideal = np.add.reduceat(z_ideal, starts) / counts
        maxima = np.stack([np.maximum.reduceat(row, starts) for row in maxima])
        sign = sign[starts]
    units = _Block(s, requests, starts, sign, z_ideal, maxima)
    return [units.frame(i, starts, counts) for i in range(len(requests))]


class _Samples(NamedTuple):
    """The requests' sampled outputs side by side, sorted by trial, group and value:
    flat positions (``at``), exact values, spacing, correctly rounded values, the sort group
    (each trial's numbered past the previous one's), where each trial's block starts
    (``bounds``, one more than the requests) and the group each block's numbers start
    at (``base``)."""

    at: np.ndarray
    e: np.ndarray
    ulp: np.ndarray
    ideal: np.ndarray
    group: np.ndarray
    same: np.ndarray  # whether each output is one unit with the one before it
    bounds: list[int]
    base: list[int]

    @classmethod
    def of(cls, requests: Sequence[FrameRequest], dtype: str) -> _Samples:
        picked, base, divisor, flush = [], [0], [], []
        for r in requests:
            size = r.flat_exact.size
            stride = max(1, -(-size // STAT_SAMPLE))  # an empty output: no units
            index = np.arange(r.seed % stride, size, stride)
            picked.append(index)
            group_size = r.model.group_size or max(size, 1)  # no groups: one per trial
            divisor.append(group_size)
            base.append(base[-1] + (int(index[-1]) // group_size + 1 if index.size else 0))
            flush.append(_FLUSH_MARGIN * r.model.flush)
        lengths = [p.size for p in picked]
        index = np.concatenate(picked)
        e = np.concatenate([r.flat_exact[p] for r, p in zip(requests, picked, strict=True)])
        keep = np.isfinite(e)
        at = 0
        for r, p in zip(requests, picked, strict=True):
            if r.flat_got is not None:
                keep[at:at + p.size] &= np.isfinite(r.flat_got[p])
            at += p.size
        # the spacing at every sampled output (the dropped ones' is never read); where
        # flushing float32 subnormals to zero (allowed) could move an output by more than
        # 1/64 of its spacing, its error says nothing about rounding
        ulp = spacing(e, dtype)
        if any(flush):
            keep &= ulp >= np.repeat(flush, lengths)
        grouped = any(r.model.group_size for r in requests)
        # the sort group: an op's group, numbered past the previous trial's; a trial
        # without groups one group (an integer division costs more than a float one)
        group = np.repeat(base[:-1], lengths)
        if grouped:
            group += index // np.repeat(divisor, lengths)
        kept = np.flatnonzero(keep)
        bounds = [0, *np.searchsorted(kept, np.cumsum(lengths)).tolist()]
        order = kept[_order(requests, group[kept], e[kept], bounds)]
        index, e, ulp, group = index[order], e[order], ulp[order], group[order]
        same = e[1:] == e[:-1]
        if grouped:
            same &= group[1:] == group[:-1]
        else:
            same[[b - 1 for b in bounds[1:-1] if 0 < b < e.size]] = False  # a trial ends
        # float32's cast rounds as fast as any; a 16-bit type's costs far more
        ideal = round_to(e, dtype) if dtype == "float32" else nearest(e, ulp, dtype)
        return cls(index, e, ulp, ideal, group, same, bounds, base)


def _order(requests: Sequence[FrameRequest], group: np.ndarray, e: np.ndarray,
           bounds: list[int]) -> np.ndarray:
    """The order of the kept samples by trial, group and value, one sort per trial (a
    sort's cost grows faster than its length): the outputs of a trial with groups by
    group, then value, ties in place; those of a trial without by ``np.argsort`` of
    their values, as a trial alone has them (its ties in that sort's order)."""
    parts = []
    for i, r in enumerate(requests):
        a, b = bounds[i], bounds[i + 1]
        mine = (_by_group_then_value(group[a:b], e[a:b]) if r.model.group_size
                else np.argsort(e[a:b]))
        parts.append(mine + a)
    order: np.ndarray = np.concatenate(parts) if parts else np.zeros(0, dtype=np.intp)
    return order


class _Block:
    """The requests' units side by side (their terms, a trial's a block of its own) and
    the checks' weights and sums made over them, read out trial by trial (:meth:`frame`)."""

    def __init__(self, s: _Samples, requests: Sequence[FrameRequest], starts: np.ndarray,
                 sign: np.ndarray, z_ideal: np.ndarray, maxima: np.ndarray) -> None:
        self.s, self.sign, self.z_ideal = s, sign, z_ideal
        self.sd, self.common, self.systematic, self.bound = maxima
        # each trial's units: where its block starts, and each unit's group as the trial
        # alone numbers it (a group of the op's, else the unit's first output's place),
        # and as the block numbers it (past the previous trials' groups)
        self.unit_bounds: list[int] = np.searchsorted(starts, s.bounds).tolist()
        local, offsets, at = [], [], 0
        for i, r in enumerate(requests):
            a, b = self.unit_bounds[i], self.unit_bounds[i + 1]
            if r.model.group_size:
                mine = s.group[starts[a:b]] - s.base[i]
            else:
                mine = starts[a:b] - s.bounds[i]
            local.append(mine)
            offsets.append(at)
            at += int(mine[-1]) + 1 if mine.size else 0
        self.local = local
        self.offsets = offsets
        self.groups = at
        self.enough = [b - a >= _MIN_UNITS for a, b in pairwise(self.unit_bounds)]
        self.shared = [bool(self.common[a:b].any()) for a, b in pairwise(self.unit_bounds)]
        self.group = np.zeros(0, dtype=np.int64)  # read only when a trial shares an error
        if any(self.shared):
            self.group = np.concatenate(local) + np.repeat(offsets,
                                                           np.diff(self.unit_bounds))
        self._terms()

    def _sums(self, values: np.ndarray) -> np.ndarray:
        """``values`` summed per group (the block's numbering)."""
        out: np.ndarray = np.bincount(self.group, weights=values, minlength=self.groups)
        return out

    def _terms(self) -> None:
        """The bias and spread checks' weights over every unit of the block (see
        :func:`_bias_check` and :func:`_spread_check`); the terms of a trial whose common
        scale is zero everywhere leave its shared error out, as its own would."""
        sd, common, systematic, bound = self.sd, self.common, self.systematic, self.bound
        # the terms each trial sums, as rows (a row's slice sums as the slice alone)
        self.totals = totals = np.empty((6, sd.size))
        sd2 = sd ** 2
        v = sd + sd2 + common + systematic
        w = np.divide(1.0, np.maximum(v, _ROUNDING_VARIANCE), out=totals[2])
        expected = sd2 + systematic ** 2
        ws = np.divide(1.0, np.maximum(expected, _ROUNDING_VARIANCE), out=totals[5])
        reach = bound + 0.5
        self.fit: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.shared_sums: np.ndarray | None = None
        if any(self.shared):
            self.shared_sums = self._sums(w * common) ** 2
            h = common * self.sign
            common2 = common ** 2
            fit_total = np.maximum(self._sums(ws * common2), 1e-300)
            self.fit = (ws * h, fit_total, h)
            noise = self._sums(ws * ws * common2 * (expected + 0.25)) / fit_total ** 2
            if all(self.shared):
                expected = expected + common2 * noise[self.group]
                reach = reach + ERROR_LAMBDA * common
            else:
                mask = np.repeat(self.shared, np.diff(self.unit_bounds))
                expected = np.where(mask, expected + common2 * noise[self.group], expected)
                reach = np.where(mask, reach + ERROR_LAMBDA * common, reach)
        flips = sd + sd2 + systematic + common + expected
        self.w, self.w_sign, self.ws = w, w * self.sign, ws
        reach2 = reach ** 2
        np.multiply(w * w, v, out=totals[0])
        np.multiply(w, systematic, out=totals[1])
        np.multiply(ws * ws * flips, reach2, out=totals[3])
        np.multiply(ws, expected, out=totals[4])
        self.tops = tops = np.empty((2, w.size))
        np.multiply(2.0 * w, bound + 0.5, out=tops[0])
        reach2 += 0.25
        np.multiply(ws, reach2, out=tops[1])

    def frame(self, i: int, starts: np.ndarray, counts: np.ndarray) -> _Frame:
        """Trial ``i``'s frame, its arrays views of the block's."""
        s = self.s
        a, b = s.bounds[i], s.bounds[i + 1]
        ua, ub = self.unit_bounds[i], self.unit_bounds[i + 1]
        units = _Units(self.sign[ua:ub], self.sign[ua:ub], self.z_ideal[ua:ub],
                       self.sign[ua:ub], self.sd[ua:ub], self.common[ua:ub],
                       self.systematic[ua:ub], self.bound[ua:ub],
                       np.asarray(self.local[i], dtype=np.int64))
        tied = ub - ua < b - a
        bias = spread = None
        if self.enough[i]:
            # each sum over the trial's units alone, in their order: NumPy's pairwise sum
            # of a row's slice is that of the slice alone
            independent, allowance, total, variance, mean, spread_total = np.add.reduce(
                self.totals[:, ua:ub], axis=1).tolist()
            top_bias, top_spread = np.maximum.reduce(self.tops[:, ua:ub], axis=1).tolist()
            fit = None
            shared = 0.0
            if self.shared[i]:
                assert self.fit is not None and self.shared_sums is not None
                g0, g1 = self.offsets[i], self.offsets[i] + int(units.group[-1]) + 1
                shared = float(_total(self.shared_sums[g0:g1]))
                w_h, fit_total, h = self.fit
                fit = (w_h[ua:ub], fit_total[g0:g1], h[ua:ub])
            bias = (self.w[ua:ub], self.w_sign[ua:ub],
                    _bernstein(independent + shared, top_bias), allowance, total)
            spread = _SpreadTerms(self.ws[ua:ub], fit, mean,
                                  _bernstein(variance, top_spread), spread_total)
        return _Frame(s.at[a:b], s.e[a:b], s.ulp[a:b], s.ideal[a:b],
                      starts[ua:ub] - a if tied else None, counts[ua:ub] if tied else None,
                      units, bias, spread)


def _frame_alone(r: FrameRequest, dtype: str) -> _Frame:
    """One trial's frame (:func:`frames`), made alone."""
    flat_exact, model = r.flat_exact, r.model
    stride = max(1, -(-flat_exact.size // STAT_SAMPLE))  # an empty output: no units
    index = np.arange(r.seed % stride, flat_exact.size, stride)
    sampled = flat_exact[index]
    keep = np.isfinite(sampled)
    if r.flat_got is not None:
        keep &= np.isfinite(r.flat_got[index])
    gaps = spacing(sampled, dtype)  # the dropped outputs' spacing is never read
    if model.flush:
        keep &= gaps >= _FLUSH_MARGIN * model.flush
    if not bool(keep.all()):
        index, e, gaps = index[keep], sampled[keep], gaps[keep]
    else:
        e = sampled
    # sorted, and equal neighbours found (finite values: equal exactly when their
    # difference is 0)
    if model.group_size:
        groups = index // model.group_size
        order = _by_group_then_value(groups, e)
        groups, e = groups[order], e[order]
        same = (e[1:] == e[:-1]) & (groups[1:] == groups[:-1])
    else:
        order = np.argsort(e)
        e = e[order]
        same = e[1:] == e[:-1]
        groups = np.arange(e.size)
    index, ulp = index[order], gaps[order]
    ideal = round_to(e, dtype) if dtype == "float32" else nearest(e, ulp, dtype)
    scales = model.scales(index)
    z_ideal = (ideal - e) / ulp
    # one array, each row divided and reduced as it would be alone
    maxima = np.stack([scales.sd, scales.common, scales.systematic,
                       model.allowed.reshape(-1)[index]]) / ulp
    sign = np.sign(e)
    starts = counts = None
    if same.any():
        starts = np.concatenate(([0], np.flatnonzero(~same) + 1))
        counts = np.diff(np.append(starts, e.size))
        z_ideal = np.add.reduceat(z_ideal, starts) / counts
        maxima = np.maximum.reduceat(maxima, starts, axis=1)
        sign, groups = sign[starts], groups[starts]
    sd, common, systematic, bound = maxima
    units = _Units(sign, sign, z_ideal, sign, sd, common, systematic, bound,
                   np.asarray(groups, dtype=np.int64))
    if sign.size < _MIN_UNITS:
        return _Frame(index, e, ulp, ideal, starts, counts, units, None, None)
    sd2 = sd ** 2
    return _Frame(index, e, ulp, ideal, starts, counts, units, _bias_terms(units, sd2),
                  _spread_terms(units, sd2))


def _bias_terms(u: _Units, sd2: np.ndarray | None = None) -> BiasTerms:
    """The bias check's weights (and times the signs), threshold, allowance and total
    weight, of one trial's units: see :func:`_bias_check`. ``sd2``: ``u.sd ** 2``, when
    made already."""
    sd2 = u.sd ** 2 if sd2 is None else sd2
    v = _plus(_plus(u.sd + sd2, u.common), u.systematic)
    w = 1.0 / np.maximum(v, _ROUNDING_VARIANCE)
    independent = float(_total(w * w * v))
    shared = float(_total(_group_sums(w * u.common, u.group) ** 2)) if u.common.any() else 0.0
    threshold = _bernstein(independent + shared, float(_largest(2.0 * w * (u.bound + 0.5))))
    return w, w * u.sign, threshold, float(_total(w * u.systematic)), float(_total(w))


def _plus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b``, bit for bit, skipping the addition where ``b`` is all zeros (a term the
    op's model does not have: matmul's shared error, a systematic error without TF32);
    ``a`` is non-negative, so ``a + 0`` is ``a``."""
    return a + b if b.any() else a


def _spread_terms(u: _Units, sd2: np.ndarray | None = None) -> _SpreadTerms:
    """The spread check's weights, the shared error's fit, the expected statistic, its
    threshold and the total weight, of one trial's units: see :func:`_spread_check`."""
    sd2 = u.sd ** 2 if sd2 is None else sd2
    expected = _plus(sd2, u.systematic ** 2)
    w = 1.0 / np.maximum(expected, _ROUNDING_VARIANCE)
    reach = u.bound + 0.5
    fit = None
    if u.common.any():
        h = u.common * u.sign
        common2 = u.common ** 2
        fit_total = np.maximum(_group_sums(w * common2, u.group), 1e-300)
        fit = (w * h, fit_total, h)
        noise = _group_sums(w * w * common2 * (expected + 0.25), u.group) / fit_total ** 2
        expected = expected + common2 * noise[u.group]
        reach = reach + ERROR_LAMBDA * u.common
    flips = _plus(_plus(_plus(u.sd + sd2, u.systematic), u.common), expected)
    reach2 = reach ** 2
    variance = float(_total(w * w * flips * reach2))
    reach2 += 0.25
    threshold = _bernstein(variance, float(_largest(w * reach2)))
    return _SpreadTerms(w, fit, float(_total(w * expected)), threshold, float(_total(w)))


def nearest(e: np.ndarray, ulp: np.ndarray, dtype: str) -> np.ndarray:
    """``e`` (finite float64) rounded to nearest, ties to even, among the numbers of
    ``dtype`` whose spacing at each value is ``ulp`` (:func:`~pytest_arbiter.core.dtypes.
    spacing`), back in float64; past the largest finite one, an infinity: bit for bit
    :func:`~pytest_arbiter.core.dtypes.round_to`, without a cast to the narrow type (for
    values it must round to subnormals, or bfloat16's, a cast costs a hundred times
    more). ``e / ulp`` is exact (a power of two), and so is its product with ``ulp``."""
    out: np.ndarray = np.rint(e / ulp)
    out *= ulp
    big = np.abs(out) > precision(dtype).largest
    if big.any():
        out = np.where(big, np.copysign(np.inf, out), out)
    return out


def _by_group_then_value(groups: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``np.lexsort((e, groups))`` for finite ``e``, a few times faster: outputs in runs
    of one length per group, groups rising (a softmax's rows, sampled evenly), as the rows
    of a matrix, each sorted stably; else a stable sort of complex numbers orders by the
    real part (the group, exact in float64), then the imaginary (the value), ties kept in
    place."""
    n = e.size
    if n and groups[-1] > groups[0]:
        rows = int(groups[-1] - groups[0]) + 1
        run = n // rows
        if run > 1 and rows * run == n:
            grid = groups.reshape(rows, run)
            if bool((grid == grid[:, :1]).all()) and bool((grid[1:, 0] > grid[:-1, 0]).all()):
                order: np.ndarray = np.argsort(e.reshape(rows, run), axis=1, kind="stable")
                order += np.arange(0, n, run)[:, None]
                return order.reshape(-1)
    pairs = np.empty(e.size, dtype=np.complex128)
    pairs.real = groups
    pairs.imag = e
    order = np.argsort(pairs, kind="stable")
    return order


def _units(frame: _Frame, flat_got: np.ndarray) -> _Units:
    """The frame's units with the output's errors, in ulp: ``d`` beyond the correctly
    rounded value, ``z`` from the exact one (averaged over each unit's outputs)."""
    g = flat_got[frame.index]
    d, z = (g - frame.ideal) / frame.ulp, (g - frame.e) / frame.ulp
    if frame.starts is not None:
        d = np.add.reduceat(d, frame.starts) / frame.counts
        z = np.add.reduceat(z, frame.starts) / frame.counts
    u = frame.units  # made field by field: dataclasses.replace costs more than the rest
    return _Units(d, z, u.z_ideal, u.sign, u.sd, u.common, u.systematic, u.bound, u.group)


def _bernstein(variance: float, largest: float) -> float:
    """The deviation a sum of independent zero-mean terms (total variance ``variance``,
    each within ``largest`` of its mean) exceeds with probability at most STAT_ALPHA."""
    return math.sqrt(2.0 * _LOG_TERM * variance) + 2.0 / 3.0 * _LOG_TERM * largest


_total = np.add.reduce
"""``np.sum`` of a 1-D array, without its wrapper (the checks' units are 1-D)."""
_largest = np.maximum.reduce
"""``np.max`` of a 1-D array, likewise."""


def _group_sums(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.bincount(group, weights=values)
    return out


def _bias_check(u: _Units, terms: BiasTerms
                ) -> tuple[float, str]:
    """Bias: the weighted mean of ``d`` (signed, and relative to each output's sign) is
    zero for round to nearest, up to the model's systematic allowance and its noise.

    Under the rounding model, E[d] equals the mean shift of the value before the last
    rounding (its position within a spacing being uniform), and
    E[d^2] <= E|c| + E[c^2] for a shift c: so with c of scale sd (independent), common
    (shared by a group) and systematic, Var(d) <= sd + sd^2 + common + systematic.
    """
    w, w_sign, threshold, allowance, total = terms
    worst_ratio, worst = 0.0, None
    for stat, lean in ((float(_total(w_sign * u.d)), ("away from zero", "toward zero")),
                       (float(_total(w * u.d)), ("upward", "downward"))):
        ratio = (abs(stat) - allowance) / threshold
        if ratio > worst_ratio:
            worst_ratio, worst = ratio, (stat, lean)
    if worst is None or worst_ratio <= 1.0:
        return worst_ratio, ""  # a passing check's reason is never read: not written
    stat, lean = worst
    return worst_ratio, (
        f"bias check: the errors lean {lean[0] if stat > 0 else lean[1]}, "
        f"{stat / total:+.3g} ulp on average over {u.d.size} distinct outputs, "
        f"where round to nearest allows {(allowance + threshold) / total:.2g} "
        f"({worst_ratio:.3g}x the bound)")


def _spread_check(u: _Units, terms: _SpreadTerms) -> tuple[float, str]:
    """Spread: the squared error beyond the correctly rounded result's, z^2 - z_ideal^2,
    has mean E[c^2] <= sd^2 + systematic^2 for a shift c before the last rounding. A
    group's shared relative error is first estimated (least squares, clipped to the
    budget's ERROR_LAMBDA scales) and taken out, its estimation error allowed for."""
    z = u.z
    if terms.fit is not None:
        w_h, fit_w, h = terms.fit
        slope = np.clip(_group_sums(w_h * z, u.group) / fit_w, -ERROR_LAMBDA, ERROR_LAMBDA)
        z = z - slope[u.group] * h
    stat = float(_total(terms.w * (z ** 2 - u.z_ideal ** 2)))
    mean, threshold, total = terms.mean, terms.threshold, terms.total
    ratio = (stat - mean) / threshold
    if not ratio > 1.0:
        return ratio, ""  # a passing check's reason is never read: not written
    text = (f"spread check: the errors are {math.sqrt(max(stat, 0.0) / total):.3g} ulp RMS "
            f"beyond correct rounding over {z.size} distinct outputs, where the rounding "
            f"model allows {math.sqrt((mean + threshold) / total):.3g} ({ratio:.3g}x the bound)")
    return ratio, text


def _statistics(got: np.ndarray, exact: np.ndarray, model: ErrorModel, dtype: str,
                seed: int, prep: PreparedTrial | None = None) -> tuple[float, float, str]:
    """``(bias ratio, spread ratio, reason)`` of one trial; a ratio over 1 fails, and the
    reason says which check failed and by how much ("" when both pass). The frame is made
    once for ``prep``'s trial, for outputs finite wherever it samples (an output that is
    not gets a frame of its own)."""
    flat_got = got.reshape(-1)
    frame = prep.checks if prep is not None else None
    if frame is None:
        frame = _frame(exact.reshape(-1), None, model, dtype, seed)
        if prep is not None:
            prep.checks = frame
    if not bool(np.isfinite(flat_got[frame.index]).all()):
        frame = _frame(exact.reshape(-1), flat_got, model, dtype, seed)
    if frame.bias is None or frame.spread is None:
        return 0.0, 0.0, ""
    units = _units(frame, flat_got)
    bias, bias_text = _bias_check(units, frame.bias)
    spread, spread_text = _spread_check(units, frame.spread)
    if bias > 1.0:
        return bias, spread, bias_text
    if spread > 1.0:
        return bias, spread, spread_text
    return bias, spread, ""
