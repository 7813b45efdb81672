"""Tests of pytest_arbiter/project/."""
