"""What building a key's plan reads from its arbiter: the settings fixed for the
arbiter's life (:class:`ArbiterConfig`) and its parts (:class:`ArbiterParts`), so the
planner needs no import of the :class:`~pytest_arbiter.decision.arbiter.Arbiter` that
calls it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from pytest_arbiter.core.candidates import CandidateRegistry
from pytest_arbiter.core.gate import GATE_SEED
from pytest_arbiter.decision.gating import GateMemo
from pytest_arbiter.decision.plans import PlanTables
from pytest_arbiter.decision.rechecking import Rechecker
from pytest_arbiter.decision.record import Record
from pytest_arbiter.decision.selection import DispatchEvent
from pytest_arbiter.decision.states import DEFAULT_CALL_TIMEOUT_S, DispatchKey
from pytest_arbiter.store.cache import MeasureCache
from pytest_arbiter.timing.measure import ComparePolicy


@dataclass(frozen=True)
class ArbiterConfig:
    """How an arbiter measures and gates (fixed for its life)."""

    policy: ComparePolicy | None = None
    gate_seed: int = GATE_SEED
    gate: bool = True
    call_timeout_s: float | None = DEFAULT_CALL_TIMEOUT_S

    def compare_policy(self) -> ComparePolicy:
        policy = self.policy or ComparePolicy()
        if self.call_timeout_s is not None and policy.call_timeout_s is None:
            policy = replace(policy, call_timeout_s=self.call_timeout_s)
        return policy


class ArbiterParts(Protocol):
    """The parts of an arbiter a plan is built from (:class:`~pytest_arbiter.decision.
    arbiter.Arbiter` has them)."""

    registry: CandidateRegistry
    cache: MeasureCache
    config: ArbiterConfig
    record: Record
    plans: PlanTables
    gates: GateMemo
    recheck: Rechecker
    events: dict[DispatchKey, DispatchEvent]

    def stamp(self) -> tuple[int, int, int]: ...
