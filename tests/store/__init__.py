"""Tests of pytest_arbiter/store/."""
