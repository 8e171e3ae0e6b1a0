"""Ember's version, in a leaf module so that any engine module can record it without importing the package."""

__version__ = "0.1.0"  # keep equal to `version` in pyproject.toml
