"""Telling the memoised plans that what they were built from changed.

A registry or a cache that changes calls :meth:`Listeners.fire`; each arbiter listening
throws its plan table away and plans again on the next dispatch. The hot path then
checks no version stamp on a hit: a plan in the table is current by construction.
Listeners are held weakly, so a registry shared by many short-lived arbiters (one per
test) does not keep them alive.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable


class Listeners:
    """Bound methods to call when something changes, held weakly."""

    __slots__ = ("_lock", "_refs")

    def __init__(self) -> None:
        self._refs: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._lock = threading.Lock()

    def add(self, method: Callable[[], None]) -> None:
        """Call ``method`` (a bound method) on every later :meth:`fire`."""
        with self._lock:
            self._refs = [r for r in self._refs if r() is not None]
            self._refs.append(weakref.WeakMethod(method))

    def fire(self) -> None:
        """Call every listener still alive."""
        for ref in list(self._refs):
            method = ref()
            if method is not None:
                method()
