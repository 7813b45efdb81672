"""Tests of pytest_arbiter/decision/, the arbiter driven directly (no pytest): picks,
the cache and outcomes (test_arbiter.py), lead-safety, declines and errors
(test_dispatch.py), the memoised hot path (test_hot_path.py), degrades instead of silent
fallbacks (test_fallback.py), low-confidence picks (test_evidence.py) and out-of-date
entries (test_freshness.py). The same behaviour through pytest runs: tests/plugin/."""
