"""Tests of pytest_arbiter/core/."""
