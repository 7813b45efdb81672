"""Tests of pytest_arbiter/core/: the F4 gate (test_gate.py; its power against mutants,
test_gate_power.py), registration of candidates and ops (test_registration.py), and users'
own ops through the gate (test_user_op_trials.py)."""
