"""Tests of pytest_arbiter/plugin/."""
