"""Tests of pytest_arbiter/session/ without pytest: the run's ledger, the controller's
verdict and the summary (test_ledger.py), the fixture (test_fixture.py) and the settings
(test_settings.py). Cancellation (signals.py) is tested end to end: plugin/test_cancel.py."""
