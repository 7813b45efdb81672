"""Tests of pytest_arbiter/runtime/."""
