"""Fixtures for the reference engine tests (the model fixtures are in tests/conftest.py)."""
