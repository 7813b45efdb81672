"""Tests of pytest_arbiter/gating/."""
