"""What many test modules build: paths, latency statistics, cache entries, candidates.

One definition each, with parameters where the modules need different values, so a
test states what it depends on and a change of a constructor is made in one place.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root folder (the checkout, or the unpacked sdist)."""
