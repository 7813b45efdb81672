"""Tests of pytest_arbiter/cli/."""
