"""Tests of pytest_arbiter/timing/."""
