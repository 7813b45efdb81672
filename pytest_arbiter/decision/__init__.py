"""The decision core: which candidate runs a dispatch, by measurement or by tier.

Modules, each importing only those above it in this list:

- :mod:`~.states`: the vocabulary (modes, keys, verdict kinds, strict-mode errors);
- :mod:`~.screen`: can a candidate run here, on these inputs;
- :mod:`~.selection`: what a decision hands back (a pick, a key's event);
- :mod:`~.gating`: the F4 gate's typed verdicts, memoised per process;
- :mod:`~.timers`, :mod:`~.entry`, :mod:`~.tuning`: measured arbitration (gate, time
  side by side, the one ranking rule, the entry);
- :mod:`~.record`, :mod:`~.rechecking`, :mod:`~.plans`, :mod:`~.planner`: what a run
  records, re-timing a cached winner, the memoised plans and how a key's is built;
- :mod:`~.arbiter`: the :class:`Arbiter`, its hot path and its slow path.
"""

