"""Tests of pytest_arbiter/cli/: the commands on real files (test_cli.py), what they
print for a person (test_cli_output.py), hostile and damaged inputs (test_hostile.py) and
the HTML report (test_report.py)."""
