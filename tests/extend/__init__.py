"""Tests of pytest_arbiter/extend/: plugins' hooks and backends (test_hooks.py), a
pip-installed package adding both (test_entry_points.py), and code fingerprints
(test_fingerprint.py)."""
