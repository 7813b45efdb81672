"""Tests of pytest_arbiter/timing/: the interleaved comparison (test_measure.py), the
watchdog (test_watchdog.py), rechecking a winner (test_recheck.py) and the per-device
measurement lock (test_device_lock.py)."""
