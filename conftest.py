"""Project-wide pytest configuration: the tests import the package from this checkout."""
