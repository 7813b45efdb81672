"""What many cache entries share, and how a decoder points them at it.

An entry's environment, the candidates considered for it and its tuning run's host and
versions are written once, in a table at the top of a cache file, and read into one
shared, immutable :class:`FrozenMap` that every entry of that row points at; equal maps
are interned, so entries read from two copies of one file share them too. While a
document is decoded, :data:`_READING` holds its tables, and an entry's reference into
one (a row index) becomes the shared object as the entry is decoded; what is not an
index into a table read already is left to :func:`pytest_arbiter.store.entry.finish_read`.
"""

from __future__ import annotations

import datetime
import operator
import re
import threading
import weakref
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Annotated, Any, Generic, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

RowOutcome = Literal["timed", "rejected", "error", "declined", "accepts_declined",
                     "inputs_declined", "unavailable"]
"""What became of a candidate considered for a key (:class:`Considered`): ``timed`` (in
the comparison), ``rejected`` (failed the F4 gate), ``error`` (raised), ``declined``
(declined in the gate or while timed: measured, until its code changes),
``accepts_declined`` (its ``accepts()`` turned down the measured inputs: measured when it
accepts a later dispatch's), ``inputs_declined`` (declined the only inputs there were to
try, a user op's: a later tuning dispatch tries it on its own), ``unavailable`` (could
not run on the measuring machine: measured where it can)."""
ROW_OUTCOMES: tuple[RowOutcome, ...] = ("timed", "rejected", "error", "declined",
                                    "accepts_declined", "inputs_declined", "unavailable")
RETRIED: frozenset[RowOutcome] = frozenset({"accepts_declined", "inputs_declined",
                                            "unavailable"})
"""Row outcomes that leave the candidate to be measured again (see :data:`RowOutcome`)."""


_UTC = datetime.timezone.utc
FUTURE_SLACK = datetime.timedelta(minutes=10)
"""How far ahead of this machine's clock an entry's ``since`` may be (clocks drift)."""


Name = Annotated[str, Meta(min_length=1)]
OpFingerprint = Annotated[str, Meta(pattern="^(?:[0-9a-f]{16})?\\Z")]
"""An op definition's fingerprint (16 hex digits), or empty."""
Count = Annotated[int, Meta(ge=0)]
Probability = Annotated[float, Meta(ge=0.0, le=1.0)]
Since = Annotated[datetime.datetime, Meta(tz=True)]

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V], Generic[K, V]):
    """A read-only mapping, equal and hashable by content.

    Many entries point at one: equal maps are interned (one object per content in the
    process, while anything uses it), so entries read from two copies of one file
    share them, compare them by identity and keep one copy in memory.
    """

    __slots__ = ("__weakref__", "_hash", "_items")
    _items: dict[K, V]
    _hash: int | None

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        self._items = dict(items)
        self._hash = None

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: K, default: Any = None) -> Any:
        return self._items.get(key, default)

    # the dict's own views (read-only, and C loops, where Mapping's are Python ones)
    def keys(self) -> KeysView[K]:
        return self._items.keys()

    def values(self) -> ValuesView[V]:
        return self._items.values()

    def items(self) -> ItemsView[K, V]:
        return self._items.items()

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, FrozenMap):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        found = self._hash
        if found is None:
            found = self._hash = hash(frozenset(self._items.items()))
        return found

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_interned, (type(self), self._items))

    def to_dict(self) -> dict[K, V]:
        """A plain dict of the items, sorted by key."""
        return {k: self._items[k] for k in sorted(self._items)}  # type: ignore[type-var]


def _sorted_items(mapping: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
    """The items of a mapping sorted by key (a FrozenMap's read straight from its dict)."""
    items = mapping._items if isinstance(mapping, FrozenMap) else mapping
    return sorted(items.items())


def _sorted_dict(mapping: Mapping[Any, Any]) -> dict[Any, Any]:
    return dict(_sorted_items(mapping))


_INTERNED: weakref.WeakValueDictionary[Any, FrozenMap[Any, Any]] = \
    weakref.WeakValueDictionary()
_INTERN_LOCK = threading.Lock()

M = TypeVar("M", bound=FrozenMap[Any, Any])


def _interned(cls: type[M], items: Mapping[Any, Any]) -> M:
    """The one ``cls`` of these items in the process (made if there is none)."""
    made = cls(items)
    tag = (cls, frozenset(made._items.items()))
    with _INTERN_LOCK:
        found = _INTERNED.get(tag)
        if found is None:
            _INTERNED[tag] = made
            return made
    return found  # type: ignore[return-value]


class Environment(FrozenMap[str, str]):
    """What an entry's timings are valid under: the device's name and the versions of
    what runs the kernels (``numpy``, ``blas``, ``python``; ``cupy``, ``cuda_runtime``,
    ``driver`` on a GPU). A new driver or BLAS makes a new environment."""

    __slots__ = ()


class Reasons(FrozenMap[str, str]):
    """Candidate name to the reason it was passed over (an entry's ``rejected``)."""

    __slots__ = ()


class Versions(FrozenMap[str, str]):
    """Package name to version (``pytest-arbiter``, ``numpy``, ``python``)."""

    __slots__ = ()


class Run(FrozenMap[str, Any]):
    """The provenance that every entry of one tuning run shares: ``host``,
    ``device_name`` and ``versions`` (any of them may be missing)."""

    __slots__ = ()


class _RunRow(Struct, frozen=True, gc=False, forbid_unknown_fields=True, omit_defaults=True):
    device_name: str | UnsetType = UNSET
    host: str | UnsetType = UNSET
    versions: dict[str, str] | UnsetType = UNSET


class Considered(Struct, frozen=True, gc=False, forbid_unknown_fields=True,
                 omit_defaults=True):
    """One candidate considered for a key: what its code was, and what became of it."""

    fingerprint: Name
    """A short hash of the candidate's code (``fingerprint_of``)."""
    outcome: RowOutcome
    """What became of it (:data:`RowOutcome`)."""
    reason: str = ""
    """Why it was not timed (empty when it was)."""
    trials: tuple[Name, ...] = ()
    """The patterns of the F4 gate's trials it passed when timed (``own``, ``fresh``,
    ``large_magnitude``, ``regated large_magnitude``...: docs/artifacts.md); empty when
    not recorded."""
    op_fingerprint: OpFingerprint = ""
    """A verdict on a user op's candidate (rejected, raised, declined): the hash of the
    op's definition it was made against (``op_fingerprint``); empty otherwise."""

    def to_dict(self) -> dict[str, Any]:
        """``fingerprint``, ``outcome`` and, when there are, ``reason``, ``trials`` and
        ``op_fingerprint``."""
        out: dict[str, Any] = {"fingerprint": self.fingerprint, "outcome": self.outcome}
        if self.reason:
            out["reason"] = self.reason
        if self.trials:
            out["trials"] = list(self.trials)
        if self.op_fingerprint:
            out["op_fingerprint"] = self.op_fingerprint
        return out


class ConsideredMap(FrozenMap[str, Considered]):
    """Candidate name to :class:`Considered`: every candidate measured for a key."""

    __slots__ = ("_timed",)
    _timed: int

    @property
    def timed(self) -> int:
        """How many of the candidates were timed (``timed`` rows), counted once: the
        merge rule asks for every key two shards hold."""
        try:
            return self._timed
        except AttributeError:
            self._timed = list(map(_OUTCOME, self._items.values())).count("timed")
            return self._timed


NO_REASONS = _interned(Reasons, {})
NO_CONSIDERED = _interned(ConsideredMap, {})
NO_ENVIRONMENT = _interned(Environment, {})
NO_RUN = _interned(Run, {})


# -- what the file's decoder (cache_file) and entry.finish_read share -----------------


_OUTCOME = operator.attrgetter("outcome")


def _run_of(row: _RunRow | Mapping[str, Any]) -> Run:
    items = msgspec.structs.asdict(row) if isinstance(row, _RunRow) else dict(row)
    if items.get("versions", UNSET) is not UNSET:
        items["versions"] = _interned(Versions, items["versions"])
    return _interned(Run, {k: v for k, v in items.items() if v is not UNSET})


class _Tables:
    """The shared rows of one document, as the objects its entries point at (``None``:
    not read yet)."""

    def __init__(self, runs: list[Run] | None = None,
                 environments: list[Environment] | None = None,
                 considered: list[ConsideredMap] | None = None, *,
                 shared: bool = True) -> None:
        self.runs = runs
        self.environments = environments
        self.considered = considered
        self.strings: dict[Any, Any] | None = {} if shared else None
        """Each repeated value of the document's entries, once (``None``, ``shared``
        false: the entries are read a block at a time and let go, so nothing is
        shared; each keeps its own)."""
        self.pending: list[Any] = []
        """The entries decoded so far whose ``__post_init__`` left work to
        :func:`pytest_arbiter.store.entry.finish_read`."""
        self.latest = datetime.datetime.now(_UTC) + FUTURE_SLACK
        """The latest ``since`` an entry may carry: a later one is a runner's clock
        ahead, and would win every merge against the truth."""


class _Reading(threading.local):
    tables: _Tables | None = None
    """The tables of the document this thread is decoding."""


_READING = _Reading()


_SHARED_TYPES: dict[str, Any] = {"runs": Run, "environments": Environment,
                                  "considered": ConsideredMap}


def _resolved(value: Any, table: str) -> Any:
    """The shared object of an inline one (a hand-written file's object, or what an
    entry built in code holds) of ``table``."""
    if table == "runs":
        return _run_of(value)
    return _interned(_SHARED_TYPES[table], value)


def _convert(raw: Any, kind: Any) -> Any:
    """``raw`` as ``kind``; a plain ``ValueError`` (so the decoder adds where it was)."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(str(exc)) from None


def _read_tables(read: Any, tables: _Tables) -> Any:
    """``read()`` (a decode) with ``tables`` as this thread's document tables."""
    before, _READING.tables = _READING.tables, tables
    try:
        return read()
    finally:
        _READING.tables = before


_NESTED_PATH = re.compile(r" - at `\$([^`]*)` - at `\$([^`]*)`$")


def _message(exc: msgspec.ValidationError) -> str:
    """msgspec's message, one path: a value checked inside a hook reports its path in
    the value, the decoder the value's place in the file."""
    message = _NESTED_PATH.sub(lambda m: f" - at `${m.group(2)}{m.group(1)}`", str(exc))
    return message.replace("got `null`", "got `null` (NaN, infinity or None)")


def _inline(value: Any) -> Any:
    if isinstance(value, FrozenMap):
        return value._items
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


_CANONICAL = msgspec.json.Encoder(enc_hook=_inline, order="sorted")
