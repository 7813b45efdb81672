"""The ``arbiter`` fixture as a plain class, plus the ``gate_matrix`` parametrize helper.

Nothing here imports pytest: the fixture is given the session's :class:`Arbiter` and
callbacks (``fail``, ``skip``, ``expect_degrade``), so it can be tested on its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from pytest_arbiter.core.candidates import REGISTRY, CandidateRegistry
from pytest_arbiter.core.dtypes import DTYPE_NAMES
from pytest_arbiter.core.gate import GateReport
from pytest_arbiter.core.regions import MatmulRegion, Region, SoftmaxRegion
from pytest_arbiter.decision.arbiter import Arbiter
from pytest_arbiter.gating.histogram import HistogramKey


@dataclass(frozen=True)
class GateCase:
    """One (candidate, shape, dtype) of a :func:`gate_matrix`; ``id`` names the test item."""

    op: str
    candidate: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def id(self) -> str:
        return f"{self.candidate}-{'x'.join(map(str, self.shape))}-{self.dtype}"

    def region(self) -> Region:
        """The region to gate: ``(m, n, k)`` for matmul, the array shape for softmax."""
        if self.op == "matmul":
            if len(self.shape) != 3:
                raise ValueError(f"a matmul gate case needs (m, n, k), got {self.shape}")
            m, n, k = self.shape
            return MatmulRegion.of(m, n, k, self.dtype)
        if self.op == "softmax":
            return SoftmaxRegion.of(self.shape, self.dtype)
        raise ValueError(f"gate_matrix knows regions of matmul and softmax, not {self.op!r}")

    def __str__(self) -> str:
        return self.id


def gate_matrix(op: str, shapes: Iterable[Sequence[int]], dtypes: Iterable[str], *,
                target: str | None = None,
                registry: CandidateRegistry | None = None) -> list[GateCase]:
    """One case per (registered candidate of ``op``, shape, dtype), for parametrize.

    ``@pytest.mark.parametrize("arbiter_case", gate_matrix("matmul", [(32, 16, 32)],
    ["float32"]))`` makes items with ids like ``blas_matmul-32x16x32-float32``; the
    test body calls ``arbiter.gate_case(arbiter_case)``. Candidates are looked up when
    this is called, i.e. when the test module is collected; ``target`` keeps one lane's.
    A case whose candidate is unavailable here (a GPU lane on a CPU runner) skips.
    Only the built-in ops have regions to generate inputs from; a user op is a
    ``ValueError`` here, at collection (gate it on inputs: ``arbiter.gate(name, *inputs)``),
    and so is a shape with a dimension below 1: an empty region has no values to gate.
    """
    if op not in ("matmul", "softmax"):
        raise ValueError(f"gate_matrix({op!r}, ...): it generates inputs for the built-in "
                         "ops matmul and softmax only; gate a user op's candidates on "
                         "inputs of yours: arbiter.gate(candidate_name, *inputs)")
    reg = registry if registry is not None else REGISTRY
    shape_list = [tuple(int(d) for d in s) for s in shapes]
    for shape in shape_list:
        if not shape or min(shape) < 1:
            raise ValueError(f"gate_matrix({op!r}, ...): shape {shape} has a dimension below "
                             "1 (or none): an empty region has no values to gate; a "
                             "dispatch of empty inputs checks only its output's shape and "
                             "dtype (docs/contract.md)")
    dtype_list = list(dtypes)
    for dtype in dtype_list:
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"gate_matrix({op!r}, ...): unknown dtype {dtype!r}; the gate "
                             f"knows {', '.join(DTYPE_NAMES)}")
    for shape in shape_list:
        try:
            GateCase(op, "", shape, dtype_list[0] if dtype_list else "float32").region()
        except ValueError as exc:  # a shape the op's region cannot be: say so now
            raise ValueError(f"gate_matrix({op!r}, ...): {exc}") from None
    return [GateCase(op, cand.name, shape, dtype)
            for cand in reg.for_op(op, target)
            for shape in shape_list
            for dtype in dtype_list]


def _no_skip(reason: str) -> NoReturn:
    raise RuntimeError(reason)


class ArbiterFixture:
    """What a test gets as ``arbiter``: dispatch, gate and histogram on the run's arbiter."""

    def __init__(self, arbiter: Arbiter, *, fail: Callable[[str], NoReturn],
                 skip: Callable[[str], NoReturn] = _no_skip,
                 expect_degrade: Callable[[], None] | None = None) -> None:
        self.arbiter = arbiter
        self._fail = fail
        self._skip = skip
        self._expect_degrade = expect_degrade
        self.expected_degrade = False

    def dispatch(self, op: str, *inputs: Any, target: str | None = None) -> Any:
        """Run ``op`` with the arbitrated candidate; the outcome is recorded."""
        return self.arbiter.dispatch(op, *inputs, target=target)

    def gate(self, candidate_name: str, *inputs: Any, seed: int | None = None) -> GateReport:
        """F4-gate a candidate on ``inputs``; fails the test with the report when out of
        budget; skips it when the candidate cannot run here (with the ``available()``
        reason) or its ``accepts()`` turns down every gate input."""
        __tracebackhide__ = True  # pytest shows the report, not these frames
        self._skip_unavailable(candidate_name)
        report = self.arbiter.gate(candidate_name, *inputs, seed=seed)
        return self._checked(self._skip_refused(report, "these inputs"))

    def gate_region(self, candidate_name: str, region: Region,
                    seed: int | None = None) -> GateReport:
        """F4-gate a candidate on the op's generated inputs for ``region`` (as :meth:`gate`
        fails and skips)."""
        __tracebackhide__ = True  # pytest shows the report, not these frames
        self._skip_unavailable(candidate_name)
        report = self.arbiter.gate_region(candidate_name, region, seed=seed)
        return self._checked(self._skip_refused(report, region.describe()))

    def _skip_unavailable(self, candidate_name: str) -> None:
        """Skip the test when the candidate cannot run on this machine (a GPU lane on a
        CPU runner, a kernel whose optional package is missing): its gate would only
        report the missing piece as the kernel's failure."""
        __tracebackhide__ = True  # the skip's location is the test's line, not this one
        cand = self.arbiter.registry.get(candidate_name)
        reason = cand.unavailable_reason()
        if reason is not None:
            self._skip(f"candidate {candidate_name!r} (target {cand.target}) is unavailable "
                       f"here: {reason}")

    def _skip_refused(self, report: GateReport, what: str) -> GateReport:
        """Skip the test when the candidate's ``accepts()`` returned False for every gate
        input: it never runs such inputs, so it has nothing to pass or fail here (a
        ``Decline`` raised by the run still fails: the kernel took the inputs)."""
        __tracebackhide__ = True  # the skip's location is the test's line, not this one
        if not report.passed and report.trials and all(
                t.status == "declined" and t.accepts_false for t in report.trials):
            self._skip(f"candidate {report.candidate!r} does not accept {what} "
                       "(accepts() returned False for every gate input)")
        return report

    def gate_case(self, case: GateCase, seed: int | None = None) -> GateReport:
        """Gate one :func:`gate_matrix` case; skips when its candidate cannot run here or
        does not accept the case."""
        __tracebackhide__ = True  # pytest shows the report, not these frames
        return self.gate_region(case.candidate, case.region(), seed=seed)

    def histogram(self, target: str | None = None, op: str | None = None
                  ) -> dict[HistogramKey, int]:
        """The run's counts per (target, op, selected, outcome) so far."""
        return self.arbiter.histogram.counts(target=target, op=op)

    def expect_degrade(self) -> None:
        """Say this test degrades on purpose: its entries do not count against the gate."""
        self.expected_degrade = True
        if self._expect_degrade is not None:
            self._expect_degrade()

    def _checked(self, report: GateReport) -> GateReport:
        __tracebackhide__ = True
        if not report.passed:
            self._fail(report.summary())
        return report
