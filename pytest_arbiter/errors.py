"""Every exception and warning the package raises to its users, in one place.

Each names what went wrong in its message (a file, a field, a shape); code reads the type
and its fields, never the text.
"""

from __future__ import annotations


class ArtifactError(Exception):
    """An artifact could not be read or written; the message names the path."""


class ConfigurationError(ValueError):
    """The process arbiter cannot be configured as asked (a bad variable, a bad corpus)."""


class CacheMiss(LookupError):
    """Strict mode: a dispatch key has no cached winner."""

    kind = "no cached winner"
    """What strict mode refused, for the run's summary: one per class."""


class StaleEntry(CacheMiss):
    """Strict mode: a dispatch key's cached entry is out of date: its winner's code
    changed, or a candidate that can run the key was never measured for it."""

    kind = "a stale entry"


class LowConfidence(CacheMiss):
    """Strict mode: a dispatch key's cached pick has too little evidence behind it
    (:attr:`pytest_arbiter.CacheEntry.low_confidence`): re-tune it with a larger
    ``--arbiter-tune-budget``."""

    kind = "a low-confidence pick"


class Decline(Exception):
    """Raised by a kernel that cannot run these inputs, to hand the work on.

    The next candidate in the order that can run the inputs runs them; the reference runs
    only when none can, and that dispatch is recorded as ``degraded`` with ``reason``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CallTimeout(BaseException):
    """A call under :func:`watchdog` gave no result within ``seconds``.

    A ``BaseException`` (as pytest's own outcomes are), so a kernel's ``except
    Exception`` cannot swallow it; the gate and the timing catch it by name.
    """

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no result after {seconds:g} s "
                         "(the per-call watchdog, --arbiter-call-timeout)")
        self.seconds = seconds


class GpuLaneLost(RuntimeError):
    """The device lane of ``target`` cannot be used again in this process."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(reason)
        self.target = target
        self.reason = reason


class GpuUnavailable(RuntimeError):
    """Raised when a GPU candidate is run on a machine that cannot run it."""


class ReportUnavailable(Exception):
    """matplotlib is not installed: the message says what to install."""


class UnknownOpWarning(UserWarning):
    """A candidate is registered for an op that no ``op()`` registers and no built-in has:
    it is never used (a misspelt op name, or an ``op()`` that never ran)."""
