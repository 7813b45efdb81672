"""extend."""
