"""The project's own tests: one folder per layer of the package (see docs/architecture.md)."""
