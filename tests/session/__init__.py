"""Tests of pytest_arbiter/session/."""
