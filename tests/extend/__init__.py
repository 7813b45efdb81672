"""Tests of pytest_arbiter/extend/."""
