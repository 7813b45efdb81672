"""Tests of pytest_arbiter/plugin.py end to end: small real projects run by pytest
(pytester), in process or in a subprocess, with or without xdist."""
