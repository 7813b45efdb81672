"""Tests of pytest_arbiter/decision/."""
