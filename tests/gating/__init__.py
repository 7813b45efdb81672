"""Tests of pytest_arbiter/gating/: the histogram (test_histogram.py) and its file
(test_histogram_file.py), the baseline gate (test_baseline.py), what a partial run may
write (test_completeness.py) and JUnit reports (test_junit.py)."""
