"""gating."""
