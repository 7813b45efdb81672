"""The process arbiter: the one every ``pytest_arbiter.dispatch`` of a process goes through.

In a pytest run the plugin binds it to the run's arbiter (its cache, mode, gate and
histogram) from configure to unconfigure; bindings nest, so a pytester run inside a
run has its own. Outside pytest the first dispatch configures it from the environment:

* ``PYTEST_ARBITER_CACHE``: a committed corpus, read once, never written;
* ``PYTEST_ARBITER_MODE``: ``static`` (default), ``strict`` or ``tune`` (in memory);
* ``PYTEST_ARBITER_GATE``: ``1`` to F4-gate every candidate before its first run for a key
  (off by default: a candidate the key's corpus entry vouches for, gated and timed
  with the code it has now, runs ungated; any other is still gated before its first run);

or from :func:`configure`. Importing this module imports neither NumPy nor the kernels.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_arbiter.errors import ArtifactError, ConfigurationError

if TYPE_CHECKING:
    from pytest_arbiter.decision.arbiter import Arbiter
    from pytest_arbiter.decision.states import Mode
    from pytest_arbiter.gating.histogram import HistogramKey
    from pytest_arbiter.store.cache import MeasureCache

ENV_CACHE = "PYTEST_ARBITER_CACHE"
ENV_MODE = "PYTEST_ARBITER_MODE"
ENV_GATE = "PYTEST_ARBITER_GATE"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


_current: Arbiter | None = None
_bindings: list[tuple[Callable[[], Arbiter], list[bool]]] = []
_configured: Arbiter | None = None
_lock = threading.RLock()


def bind(factory: Callable[[], Arbiter]) -> None:
    """Route the process's dispatches to ``factory()`` (built at the first dispatch)
    until the matching :func:`unbind`. The plugin calls it at configure."""
    global _current
    with _lock:
        _bindings.append((factory, [False]))
        _current = None


def _set_running(factory: Callable[[], Arbiter], running: bool) -> None:
    global _current
    with _lock:
        for bound_factory, flag in _bindings:
            if bound_factory is factory:
                flag[0] = running
        _current = None


def started(factory: Callable[[], Arbiter]) -> None:
    """Say that the run bound with ``factory`` started its session: of several
    bindings, the latest started one wins, so a config a test makes and never runs
    (``pytester.getitem``, say) does not take that test's dispatches."""
    _set_running(factory, True)


def finished(factory: Callable[[], Arbiter]) -> None:
    """Say that the run bound with ``factory`` finished its session (pytester's
    ``getitem`` starts and finishes one to collect): it no longer outranks the run
    that is still going."""
    _set_running(factory, False)


def unbind(factory: Callable[[], Arbiter]) -> None:
    """End the binding made with ``factory``; the previous one (if any) applies again."""
    global _current
    with _lock:
        for i in range(len(_bindings) - 1, -1, -1):
            if _bindings[i][0] is factory:
                del _bindings[i]
                break
        _current = None


def bound() -> bool:
    """Whether a pytest run has bound the process arbiter."""
    return bool(_bindings)


def current() -> Arbiter:
    """The process arbiter: the bound run's, else the configured one, else one from
    the environment (built on first use)."""
    found = _current
    return found if found is not None else _resolve()


def _resolve() -> Arbiter:
    global _current, _configured
    with _lock:
        if _bindings:
            running = [factory for factory, flag in _bindings if flag[0]]
            found = (running[-1] if running else _bindings[-1][0])()
        else:
            if _configured is None:
                _configured = _from_environment()
            found = _configured
        _current = found
        return found


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"{name}={text!r}: expected 1 or 0 (true/false, yes/no, on/off)")


def _from_environment() -> Arbiter:
    from pytest_arbiter.decision.states import MODES, is_mode

    mode = os.environ.get(ENV_MODE, "").strip() or "static"
    if not is_mode(mode):
        raise ConfigurationError(f"{ENV_MODE}={mode!r}: modes are {', '.join(MODES)}")
    cache_path = os.environ.get(ENV_CACHE, "").strip() or None
    gate = _flag(ENV_GATE, os.environ.get(ENV_GATE, ""))
    return _build(cache_path, mode, gate, source=ENV_CACHE)


def _read_corpus(path: str | os.PathLike[str], source: str) -> MeasureCache:
    from pytest_arbiter.store import artifacts

    p = Path(path)
    if not p.is_file():
        why = "no such file" if not p.exists() else "not a file"
        raise ConfigurationError(f"{source}: cannot read the corpus {p}: {why}")
    try:
        return artifacts.read_cache(p)
    except ArtifactError as exc:
        raise ConfigurationError(f"{source}: cannot use the corpus {p}: {exc}") from None


def _build(cache: str | os.PathLike[str] | MeasureCache | None, mode: Mode, gate: bool,
           *, source: str, call_timeout_s: float | None = None) -> Arbiter:
    from pytest_arbiter.decision.arbiter import Arbiter
    from pytest_arbiter.decision.states import DEFAULT_CALL_TIMEOUT_S
    from pytest_arbiter.store.cache import MeasureCache

    if cache is None:
        store = MeasureCache()
    elif isinstance(cache, MeasureCache):
        store = cache
    else:
        store = _read_corpus(cache, source)
    return Arbiter(cache=store, mode=mode, gate=gate,
                   call_timeout_s=DEFAULT_CALL_TIMEOUT_S if call_timeout_s is None
                   else call_timeout_s)


def configure(*, cache: str | os.PathLike[str] | MeasureCache | None = None,
              mode: Mode = "static", gate: bool = False,
              call_timeout_s: float | None = None) -> Arbiter:
    """Configure the process arbiter from code (outside pytest): a corpus path (read
    only, never written) or a :class:`MeasureCache`, the mode, and whether to gate.

    Inside a pytest run the plugin's options configure it instead, so this is an error.
    Returns the new process arbiter; its histogram starts empty.
    """
    global _configured, _current
    from pytest_arbiter.decision.states import MODES, is_mode

    if not is_mode(mode):
        raise ConfigurationError(f"configure(mode={mode!r}): modes are {', '.join(MODES)}")
    with _lock:
        if _bindings:
            raise ConfigurationError(
                "pytest_arbiter.configure() inside a pytest run: the run's arbiter is "
                "configured by its options (--arbiter-cache, --arbiter-tune, ...)")
        arb = _build(cache, mode, bool(gate), source="configure(cache=...)",
                     call_timeout_s=call_timeout_s)
        _configured = arb
        _current = None
    return arb


def reset() -> None:
    """Forget the configured process arbiter; the next dispatch reads the environment."""
    global _configured, _current
    with _lock:
        _configured = None
        _current = None


def dispatch(op: str, *inputs: Any, target: str | None = None) -> Any:
    """Run ``op`` on ``inputs`` through the process arbiter and record the outcome.

    The one call a kernel library makes: in a pytest run it is gated and counted like
    the ``arbiter`` fixture's dispatches; in production it uses the configured corpus.
    """
    arb = _current
    if arb is None:
        arb = _resolve()
    # Arbiter.dispatch_inputs's plain hit, inlined (one call frame less): the same
    # signature for one or two arrays, the same plan; anything else goes there
    try:
        if len(inputs) == 1:
            x = inputs[0]
            plan = arb.hot.get((op, target, x.__class__, x.shape, x.dtype, x.strides))
        elif len(inputs) == 2:
            a, b = inputs
            plan = arb.hot.get((op, target, a.__class__, a.shape, a.dtype, a.strides,
                                b.__class__, b.shape, b.dtype, b.strides))
        else:
            plan = None
    except (AttributeError, TypeError):
        plan = None
    if plan is None:
        return arb.dispatch_inputs(op, inputs, target)
    # fields by index: unpacking a NamedTuple takes CPython's generic path, ~35 ns more
    plain = plan[0]
    if plain is None:
        return arb.dispatch_inputs(op, inputs, target)
    try:
        out = plain(*inputs)
    except Exception as exc:
        return arb.run_steps(plan[2], inputs, plan[3], exc)
    plan[1]()  # type: ignore[misc]  # set wherever run is
    return out


def default_arbiter() -> Arbiter:
    """The process arbiter: the run's in a pytest run, else one configured from the
    environment or :func:`configure`."""
    return current()


def run_arbitrated(op: str, *inputs: Any, target: str | None = None) -> Any:
    """The seed's name for a dispatch that never measures (the static tier order on a
    miss; cached winners apply), through the process arbiter and its histogram."""
    arb = current()
    if arb.mode == "tune":
        return arb.dispatch_as("static", op, *inputs, target=target)
    return arb.dispatch(op, *inputs, target=target)


def run_measured_arbitrated(op: str, *inputs: Any, target: str | None = None) -> Any:
    """The seed's name for a dispatch that measures at the first miss, through the
    process arbiter and its histogram."""
    return current().dispatch_as("tune", op, *inputs, target=target)


def dispatch_histogram(target: str | None = None, op: str | None = None
                       ) -> dict[HistogramKey, int]:
    """What ran: counts per (target, op, selected, outcome) of the process arbiter."""
    return current().histogram.counts(target=target, op=op)
